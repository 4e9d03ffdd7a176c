//! Every setting of sucl in one table: each environment variable and config-file key any part of
//! sucl reads, its default and its meaning. `docs/reference/settings.md` is generated from
//! [`SETTINGS`] by [`markdown`] (`scripts/gen-docs.sh`), and tests hold the table to the code:
//! every variable the config loader ([`Config::load`](crate::Config::load)) asks for is here as
//! a [`Section::Config`] setting and every such setting is asked for; the defaults of the
//! config settings are the loader's; and a scan of the workspace's sources fails naming any
//! `"SUCL_*"` or `"SUCLD_*"` string literal that is neither here nor a constant of the C API.

/// Which part of sucl reads a setting, and so where it applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    /// The job configuration: a key of the TOML file (`SUCL_CONFIG`, `--config`) and/or a
    /// variable, read at `init` by [`Config::load`](crate::Config::load); the variable wins.
    Config,
    /// Where ranks listen and who they are: read at `init` by the bootstrap.
    Network,
    /// Calls on device buffers (the peer-memory kernels, the staged path).
    Device,
    /// The task graph (`sucl::graph`).
    Graph,
    /// Remote devices: the client (`sucl::remote`) and the daemon `sucld`.
    Remote,
    /// The drop-in `libnccl.so.2` (sucl-nccl).
    NcclDropIn,
    /// The Python package.
    Python,
    /// Set by a launcher for its ranks (`sucl run` sets them all); read by the bootstrap. Not
    /// settings a user sets, listed because they are read.
    Launcher,
    /// Test hooks: read only by tests, test helpers, or code built with the `fault-hook`
    /// feature, which only tests enable.
    Test,
}

impl Section {
    /// Every section, in the order of the generated page.
    pub const ALL: [Section; 9] = [
        Section::Config,
        Section::Network,
        Section::Device,
        Section::Graph,
        Section::Remote,
        Section::NcclDropIn,
        Section::Python,
        Section::Launcher,
        Section::Test,
    ];

    /// The heading of the section on the generated page.
    pub fn title(self) -> &'static str {
        match self {
            Section::Config => "Job configuration (file and environment)",
            Section::Network => "Network and host identity (environment only)",
            Section::Device => "Device buffers (environment only)",
            Section::Graph => "Task graph (environment only)",
            Section::Remote => "Remote devices",
            Section::NcclDropIn => "Drop-in libnccl.so.2 (environment only)",
            Section::Python => "Python (environment only)",
            Section::Launcher => "Set by launchers (not to be set by hand)",
            Section::Test => "Test hooks (tests and test builds only)",
        }
    }
}

/// One setting.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The environment variable (`""`: none).
    pub env: &'static str,
    /// The config-file key, dotted for tables (`""`: none).
    pub key: &'static str,
    /// The default, as the page shows it.
    pub default: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// Who reads it.
    pub section: Section,
    /// Where it is read (crate and module), for maintainers.
    pub read_by: &'static str,
}

const fn s(
    section: Section,
    env: &'static str,
    key: &'static str,
    default: &'static str,
    meaning: &'static str,
    read_by: &'static str,
) -> Setting {
    Setting { env, key, default, meaning, section, read_by }
}

use Section::*;

/// Every setting sucl reads.
pub const SETTINGS: &[Setting] = &[
    // --- the job configuration (sucl-runtime config.rs) ---
    s(Config, "SUCL_CONFIG", "", "none", "path of the TOML config file (`--config` of `sucl` sets it)", "sucl-runtime config"),
    s(Config, "SUCL_BACKEND", "backend", "`auto`", "`auto`, or force a host backend: `shm`, `tcp`, `mpi`, `hier`", "sucl-runtime config"),
    s(Config, "SUCL_BACKENDS", "platforms.host.backends", "`shm,tcp,mpi` (mpi only where built and launched by MPI)", "backends the host platform may use; a backend named explicitly must load, else init fails saying why", "sucl-runtime config"),
    s(Config, "SUCL_DEFAULT_BACKEND", "default_backend", "`tcp`", "the universal fallback (`tcp` or `mpi`)", "sucl-runtime config"),
    s(Config, "", "platforms.host.preferred", "`shm`", "the host platform's preferred backend (from the threshold on)", "sucl-runtime config"),
    s(Config, "SUCL_THRESHOLD", "platforms.host.threshold", "`0`", "SuCL's threshold in bytes: below it the default backend, from it the preferred one; `0` always preferred, negative never", "sucl-runtime config"),
    s(Config, "", "platforms.cuda.backends", "`nccl, ipc, staged`", "device backends calls on device buffers may use", "sucl-runtime config"),
    s(Config, "SUCL_IPC", "", "`auto`", "the peer-memory backend: `off` (or `0`) drops it, `force` sends every device collective it serves to it, `auto` (or `1`) leaves it to the tuning table and the defaults", "sucl-runtime config"),
    s(Config, "", "tuning", "none", "`[[tuning]]` rules (op or `\"*\"`, inclusive `ranks`, `bytes` `[from, to)`, backend); the first match wins; `sucl tune` writes them", "sucl-runtime config"),
    s(Config, "SUCL_TIMEOUT", "timeout", "`300`", "seconds any wait may block before it is an error", "sucl-runtime config"),
    s(Config, "SUCL_SPIN_US", "spin_us", "`50` (`0` when ranks outnumber CPUs)", "microseconds a wait busy-polls before it yields", "sucl-runtime config"),
    s(Config, "SUCL_SHM_DIR", "shm.dir", "`/dev/shm`", "the tmpfs holding the shared-memory segments", "sucl-runtime config"),
    s(Config, "SUCL_SHM_ARENA_BYTES", "shm.arena_bytes", "`8M`", "per-rank collective arena (two halves); agreed", "sucl-runtime config"),
    s(Config, "SUCL_SHM_RING_BYTES", "shm.ring_bytes", "`512K`", "per-pair point-to-point ring; agreed", "sucl-runtime config"),
    s(Config, "SUCL_SHM_SMALL_BYTES", "shm.small_bytes", "`16K`", "largest shm collective done in one step; agreed", "sucl-runtime config"),
    s(Config, "SUCL_SHM_CHUNK_BYTES", "shm.chunk_bytes", "`256K`", "pipeline chunk of large shm reductions (at 16 ranks or more, at least 1 MiB); agreed", "sucl-runtime config"),
    s(Config, "SUCL_TCP_SMALL_BYTES", "tcp.small_bytes", "`64K`", "largest tcp message using latency-optimal algorithms; agreed", "sucl-runtime config"),
    s(Config, "SUCL_TCP_PIECE_BYTES", "tcp.piece_bytes", "`256K`", "pipeline piece of tcp rings and chains; agreed", "sucl-runtime config"),
    s(Config, "SUCL_TCP_SOCKBUF", "tcp.sockbuf", "`0` (the kernel's)", "SO_SNDBUF/SO_RCVBUF of tcp connections", "sucl-runtime config"),
    s(Config, "SUCL_TCP_READ_AHEAD_BYTES", "tcp.read_ahead_bytes", "`8K`", "bytes a tcp connection reads ahead (a small frame in one syscall); `0`: none; at most `1M`", "sucl-runtime config"),
    s(Config, "SUCL_TCP_POLL_FIRST", "tcp.poll_first", "`2`", "with this many peer sockets or more, a wait asks poll(2) which have bytes before reading any; `1`: always; `0`: never", "sucl-runtime config"),
    s(Config, "SUCL_TCP_SPIN_US", "tcp.spin_us", "`250`", "microseconds a tcp wait busy-polls before it blocks in poll(2), where ranks have cores of their own", "sucl-runtime config"),
    s(Config, "SUCL_MAX_MESSAGE_BYTES", "max_message_bytes", "`1T`", "largest frame a peer may announce; agreed", "sucl-runtime config"),
    s(Config, "SUCL_MAX_UNEXPECTED_BYTES", "max_unexpected_bytes", "`1G`", "most bytes of messages waiting for their receive a rank holds", "sucl-runtime config"),
    s(Config, "SUCL_CHECK_COLLECTIVES", "check_collectives", "`0` (`false`)", "`1`: ranks compare every collective's arguments before its data moves (`Mismatch` on every rank)", "sucl-runtime config"),
    // --- network and identity ---
    s(Network, "SUCL_SOCKET_IFNAME", "", "the interface that reaches the store", "interface of the tcp endpoints and, under torchrun's agent, the store: names or prefixes (`eth,ib`), `^` to exclude, `=` for an exact name (NCCL_SOCKET_IFNAME's syntax)", "sucl-core bootstrap"),
    s(Network, "SUCL_PORT_RANGE", "", "any free port", "ports the listeners bind, `low-high` inclusive or one port (ports in use are skipped)", "sucl-core bootstrap"),
    s(Network, "SUCL_HOSTNAME", "", "the machine's hostname", "the name that says which ranks share a host (shm, hier); lets one machine stand for several hosts", "sucl-runtime lib"),
    s(Network, "SUCL_HIER_CHUNK_BYTES", "", "`262144`", "pipeline chunk, in bytes, of the hier backend's large all_reduce", "sucl-runtime hier"),
    // --- device buffers ---
    s(Device, "SUCL_STAGED_LANES", "", "`4`", "progress threads (lanes) of the staged path, 1 to 8; the same on every rank", "sucl-runtime cuda"),
    s(Device, "SUCL_IPC_BUFFER_BYTES", "", "32 MiB", "each rank's peer buffer of the peer-memory kernels; larger calls run in pieces; equal on every rank", "sucl-cuda ipc"),
    s(Device, "SUCL_IPC_TWO_SHOT_BYTES", "", "4 MiB / ranks", "size from which all_reduce runs two-shot (reduce-scatter + all-gather); equal on every rank", "sucl-cuda ipc"),
    s(Device, "SUCL_IPC_BLOCKS", "", "`128`", "grid cap of the peer-memory kernels (1 to 128, at most the GPU's multiprocessors); equal on every rank", "sucl-cuda ipc"),
    s(Device, "SUCL_IPC_UNROLL", "", "4 below 4 ranks, 2 from 4", "16-byte slots each thread loads at once (1, 2, 4 or 8); equal on every rank", "sucl-cuda ipc"),
    s(Device, "SUCL_IPC_END_BARRIER", "", "`0`", "`1`: a barrier at the end of every kernel instead of alternating buffer halves; equal on every rank", "sucl-cuda ipc"),
    s(Device, "SUCL_IPC_PUSH", "", "`1`", "`1`: one-shot all_reduce writes each rank's input into every rank's buffer; `0`: each rank reads the peers'; equal on every rank", "sucl-cuda ipc"),
    // --- task graph ---
    s(Graph, "SUCL_GRAPH_THREADS", "", "cores / local ranks (at least 1)", "worker threads per rank for host kernels", "sucl-graph queue"),
    s(Graph, "SUCL_GRAPH_CPD", "", "`1`", "`0` turns collective pattern discovery off (push / await-push only)", "sucl-graph queue"),
    s(Graph, "SUCL_GRAPH_DUMP", "", "none", "a directory: each rank writes its task and command graphs there as JSON", "sucl-graph queue"),
    s(Graph, "SUCL_GRAPH_DEVICE_TRANSPORT", "", "`auto`", "how GPU ranks of the task graph move data (see the task-graph guide)", "sucl-graph device"),
    // --- remote devices ---
    s(Remote, "SUCL_REMOTE", "remote (`[[remote]] address`)", "none", "the daemons to use, `host:port`, comma-separated", "sucl-remote client"),
    s(Remote, "SUCL_REMOTE_TOKEN", "", "none", "the daemons' token, 64 hex digits (else `SUCL_REMOTE_TOKEN_FILE`)", "sucl-remote client"),
    s(Remote, "SUCL_REMOTE_TOKEN_FILE", "remote_token_file", "none", "a file holding the daemons' token", "sucl-remote client"),
    s(Remote, "SUCL_OPENCL_TIMEOUT", "", "30", "the OpenCL ICD: seconds a call to a daemon may take, and a lost daemon is waited for", "sucl-opencl"),
    s(Remote, "SUCL_OPENCL_QUIET", "", "unset", "the OpenCL ICD: set, it does not print failures the program sees only as error codes", "sucl-opencl"),
    s(Remote, "SUCL_OPENCL_DISABLE", "", "unset", "set, the OpenCL ICD offers no platform (sucld sets it for itself, so it never serves its own ICD)", "sucl-opencl, sucld"),
    s(Remote, "SUCL_REMOTE_TLS", "remote_tls", "on", "`off` (or `0`, `false`): plain TCP, for daemons started with `--no-tls`", "sucl-remote client"),
    s(Remote, "SUCL_REMOTE_TLS_PIN", "remote_tls_pins", "none", "SHA-256 pins of the daemons' certificates the client trusts, comma-separated", "sucl-remote client"),
    s(Remote, "SUCL_REMOTE_TLS_CERT", "remote_tls_certs", "none", "PEM certificate files the client trusts, comma-separated", "sucl-remote client"),
    s(Remote, "SUCL_REMOTE_SPIN_US", "", "50 (0 under 4 cores)", "microseconds a call to a daemon spins for its reply before it sleeps (at most 10000; 0: never spins)", "sucl-remote client"),
    s(Remote, "SUCL_REMOTE_PEER_PATH", "", "`auto`", "`sucld --peer-path`: `auto` migrates between GPU daemons of one host through peer memory, `network` always over the network", "sucl-remote daemon"),
    s(Remote, "SUCLD_TOKEN", "", "none", "`sucld`: the token clients must prove they hold, when `--token-file` is not given", "sucld"),
    s(Remote, "SUCLD_LOG", "", "`--log` (`info`)", "`sucld`: the log filter (`tracing` syntax), over `--log`", "sucld"),
    // --- the drop-in NCCL ---
    s(NcclDropIn, "SUCL_NCCL_REAL_PATH", "", "searched", "absolute path of the real `libnccl.so.2` (nothing else is tried)", "sucl-nccl settings"),
    s(NcclDropIn, "SUCL_NCCL_SERVE", "", "`1`", "`0`: forward every call to the real NCCL (a pure pass-through); equal on every rank", "sucl-nccl settings"),
    s(NcclDropIn, "SUCL_NCCL_MAX_BYTES", "", "`262144`", "largest all_reduce (bytes per rank) sucl serves; equal on every rank", "sucl-nccl settings"),
    s(NcclDropIn, "SUCL_NCCL_TIMEOUT_S", "", "`300`", "bound in seconds on the setup exchange and every wait of sucl's kernels", "sucl-nccl settings"),
    s(NcclDropIn, "SUCL_NCCL_DEBUG", "", "`0`", "`1`: print where the real NCCL was found, each communicator's setup and how many calls sucl served", "sucl-nccl settings"),
    // --- Python ---
    s(Python, "SUCL_PY_HOST", "", "`MASTER_ADDR`, else `127.0.0.1`", "`sucl.torch`: the address rank 0 listens on for the communicator's store", "python sucl/torch.py"),
    // --- set by launchers ---
    s(Launcher, "SUCL_RANK", "", "", "this process's rank (`sucl run`)", "sucl-core bootstrap"),
    s(Launcher, "SUCL_WORLD_SIZE", "", "", "the number of ranks (`sucl run`)", "sucl-core bootstrap"),
    s(Launcher, "SUCL_LOCAL_RANK", "", "", "the rank among this host's ranks (`sucl run`)", "sucl-core bootstrap"),
    s(Launcher, "SUCL_LOCAL_SIZE", "", "", "the number of ranks on this host (`sucl run`)", "sucl-core bootstrap, sucl-graph"),
    s(Launcher, "SUCL_STORE_ADDR", "", "", "the rendezvous store's address (`sucl run`: the launcher's)", "sucl-core bootstrap"),
    s(Launcher, "SUCL_STORE_HOST", "", "", "`launcher`: the launcher hosts the store, rank 0 does not", "sucl-core bootstrap"),
    s(Launcher, "SUCL_JOB_ID", "", "", "the job's id, part of the names of its shared-memory segments", "sucl-core bootstrap"),
    s(Launcher, "SUCL_JOB_SECRET", "", "", "the job secret each rank proves to the store and its peers (see the launching guide)", "sucl-core store"),
    s(Launcher, "SUCL_BOUND_CPUS", "", "", "the CPUs `sucl run` bound this rank to (informational)", "sucl-cli launcher"),
    // --- test hooks ---
    s(Test, "SUCL_FAULT_CORRUPT", "", "", "`fault-hook` builds: corrupt the outputs of collectives of one backend (tests/faults.rs)", "sucl-runtime fault"),
    s(Test, "SUCL_TEST_NCCL_INIT_FAULT", "", "", "`fault-hook` builds: `R:exit` or `R:stall` stops rank R before it joins NCCL (scripts/gpu-check.sh)", "sucl-runtime cuda"),
    s(Test, "SUCL_CHECK_V_MISMATCH", "", "", "`sucl check`: make one rank disagree in the v-collective checks (tests/vcoll.rs, tests/mpi.rs)", "sucl-cli vcheck"),
    s(Test, "SUCL_REQUIRE_GPU", "", "", "`1`: GPU tests fail instead of skipping where no GPU is found", "tests, sucl-cuda ipc tests"),
    s(Test, "SUCL_REQUIRE_GPUS", "", "", "GPU tests of the task graph fail where fewer GPUs are found", "sucl-graph tests"),
    s(Test, "SUCL_BIN", "", "", "the `sucl` binary the Python tests launch", "python tests"),
    s(Test, "SUCL_BLESS", "", "", "`1`: rewrite include/sucl.h from cbindgen instead of comparing", "sucl-capi tests"),
    s(Test, "SUCL_MAIN_ERROR_TEST_CHILD", "", "", "child-process marker of a test", "sucl-core tests"),
    s(Test, "SUCL_INT_TEST_RANK", "", "", "child-process rank of a test", "sucl-runtime tests"),
    s(Test, "SUCL_REQ_TEST_RANK", "", "", "child-process rank of a test", "sucl-runtime tests"),
    s(Test, "SUCL_STREAM_TEST_RANK", "", "", "child-process rank of a test", "sucl-stream tests"),
    s(Test, "SUCL_VTEST_RANK", "", "", "child-process rank of a test", "sucl-runtime tests"),
    s(Test, "SUCL_VTEST_OP", "", "", "the operation a child of a test runs", "sucl-runtime tests"),
    s(Test, "SUCL_VTEST_BIG", "", "", "a child of a test runs the large case", "sucl-runtime tests"),
    s(Test, "SUCL_VTEST_INVALID", "", "", "a child of a test passes invalid arguments", "sucl-runtime tests"),
    s(Test, "SUCL_VTEST_MIDWAY", "", "", "a child of a test fails midway", "sucl-runtime tests"),
    s(Test, "SUCL_VTEST_ROUNDS", "", "", "rounds a child of a test runs", "sucl-runtime tests"),
    s(Test, "SUCL_RP_SEEDS", "", "", "random-program tests: the seed range `a..b`", "sucl-stream tests"),
    s(Test, "SUCL_RP_RUN_SEEDS", "", "", "random-program tests: run these seeds", "sucl-stream tests"),
    s(Test, "SUCL_RP_PROGRAM", "", "", "random-program tests: a program to run", "sucl-stream tests"),
    s(Test, "SUCL_RP_PROGRAM_FILE", "", "", "random-program tests: a file holding a program to run", "sucl-stream tests"),
    s(Test, "SUCL_RP_RANKS", "", "", "random-program tests: ranks", "sucl-stream tests"),
    s(Test, "SUCL_RP_CHUNK", "", "", "random-program tests: seeds per child job", "sucl-stream tests"),
    s(Test, "SUCL_RP_SHRINK", "", "", "random-program tests: shrink failing programs", "sucl-stream tests"),
    s(Test, "SUCL_RP_MPI_CHILD", "", "", "random-program tests: child-process marker under mpirun", "sucl-stream tests"),
    s(Test, "SUCL_RP_KEEP_GOING", "", "", "random-program tests: `1` runs every seed, then reports every failing one", "sucl-stream tests"),
    s(Test, "SUCL_RP_MEMORY", "", "", "random-program tests: `device` runs a child's programs on device buffers", "sucl-stream tests"),
    s(Test, "SUCL_OPENCL_TESTS_REQUIRED", "", "", "`1`: the OpenCL ICD tests fail instead of skipping where no OpenCL platform is found", "sucl-opencl tests"),
    s(Test, "SUCL_RP_DUMP", "", "", "random-program tests: `seed,ranks[,exact]` prints that program", "sucl-stream tests"),
    s(Test, "SUCL_WIRE_FUZZ_SCALE", "", "", "scales the cases of the wire decoder's fuzz tests", "sucl-remote tests"),
    s(Test, "SUCL_REMOTE_FAULT_SCALE", "", "", "scales the fault cases of the remote mesh tests", "sucl-remote tests"),
    s(Test, "SUCL_REGEN_DOCS", "", "", "`1`: the reference-page tests rewrite docs/reference/ instead of comparing (scripts/gen-docs.sh)", "sucl-runtime settings, sucl-cli tests"),
];

/// The setting with environment variable `name`.
pub fn by_env(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.env == name)
}

fn cell(s: &str) -> String {
    if s.is_empty() || s.contains('`') {
        s.to_string()
    } else {
        format!("`{s}`")
    }
}

/// `docs/reference/settings.md`: the table as a page.
pub fn markdown() -> String {
    let mut out = String::from(
        "<!-- Generated from crates/sucl-runtime/src/settings.rs by scripts/gen-docs.sh; do not edit. -->\n\
         # Settings\n\n\
         Every environment variable and config-file key sucl reads. The config file is TOML, named by\n\
         `SUCL_CONFIG` or `--config`; where a setting has both, the variable wins. Settings marked\n\
         *agreed* shape an algorithm, a layout or a wire format: rank 0's value holds on every rank.\n\
         `sucl info` shows the configuration in force and where each value came from.\n",
    );
    for section in Section::ALL {
        out.push_str(&format!("\n## {}\n\n", section.title()));
        let rows: Vec<&Setting> = SETTINGS.iter().filter(|s| s.section == section).collect();
        if section >= Launcher {
            out.push_str("| variable | meaning | read by |\n|---|---|---|\n");
            for s in rows {
                out.push_str(&format!("| `{}` | {} | {} |\n", s.env, s.meaning, s.read_by));
            }
        } else {
            out.push_str("| variable | file key | default | meaning |\n|---|---|---|---|\n");
            for s in rows {
                let env = if s.env.is_empty() { String::new() } else { format!("`{}`", s.env) };
                out.push_str(&format!("| {env} | {} | {} | {} |\n", cell(s.key), s.default, s.meaning));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
    }

    #[test]
    fn every_variable_is_listed_once() {
        let mut seen = BTreeSet::new();
        for s in SETTINGS {
            assert!(s.env.is_empty() || seen.insert(s.env), "{} is listed twice", s.env);
            assert!(!s.env.is_empty() || !s.key.is_empty(), "a setting with neither variable nor key: {s:?}");
            assert!(!s.meaning.is_empty(), "{} has no meaning", s.env);
        }
    }

    /// The config loader asks for exactly the config section's variables.
    #[test]
    fn the_config_loader_reads_exactly_the_config_variables() {
        let asked = RefCell::new(BTreeSet::new());
        Config::load(None, &|k| {
            asked.borrow_mut().insert(k.to_string());
            None
        })
        .unwrap();
        let asked = asked.into_inner();
        for name in &asked {
            let s = by_env(name).unwrap_or_else(|| panic!("Config::load reads {name}, which settings::SETTINGS lacks"));
            assert_eq!(s.section, Config, "{name} is read by the config loader: its section must be Config");
        }
        for s in SETTINGS.iter().filter(|s| s.section == Config && !s.env.is_empty() && s.env != "SUCL_CONFIG") {
            assert!(asked.contains(s.env), "SETTINGS lists {} as a config variable, but Config::load never reads it", s.env);
        }
    }

    /// Each config key of the table is one the file schema accepts, and its documented default is
    /// the loader's.
    #[test]
    fn config_keys_parse_and_defaults_are_the_loaders() {
        let d = Config::default();
        for s in SETTINGS.iter().filter(|s| s.section == Config && !s.key.is_empty()) {
            // A file setting the key to its default must parse (deny_unknown_fields refuses keys
            // the schema lacks).
            let (table, leaf) = match s.key.rsplit_once('.') {
                Some((t, l)) => (Some(t), l),
                None => (None, s.key),
            };
            let raw = s.default.split('`').nth(1).unwrap_or("0");
            let value = match leaf {
                "backends" => "[\"shm\", \"tcp\"]".to_string(),
                "tuning" => continue,
                "check_collectives" => "false".to_string(),
                _ if raw.parse::<f64>().is_ok() => raw.to_string(),
                _ => format!("{raw:?}"),
            };
            let text = match table {
                Some(t) => format!("[{t}]\n{leaf} = {value}\n"),
                None => format!("{leaf} = {value}\n"),
            };
            let mut c = Config::default();
            c.apply_file("settings-table.toml", &text).unwrap_or_else(|e| panic!("key {} of the table: {e}\n{text}", s.key));
            // Byte sizes and plain numbers: the default is the loader's.
            let bytes = crate::config::parse_bytes(raw);
            if s.key.starts_with("platforms.") {
                continue; // shown per platform, not per key
            }
            let loaded = d.value_of(s.key);
            if let (Some(b), Ok(l)) = (bytes, loaded.parse::<f64>()) {
                assert_eq!(b as f64, l, "{}: the table's default {raw} is not the loader's {loaded}", s.key);
            }
        }
    }

    /// The names of the C API's constants (`#define SUCL_...` in sucl.h): not settings.
    fn c_constants() -> BTreeSet<String> {
        let h = std::fs::read_to_string(root().join("crates/sucl-capi/include/sucl.h")).unwrap();
        h.lines().filter_map(|l| l.strip_prefix("#define ")).filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
    }

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir() {
                if name != "target" && name != ".git" && name != "node_modules" && !name.to_string_lossy().starts_with('.') {
                    sources(&p, out);
                }
            } else if matches!(p.extension().and_then(|e| e.to_str()), Some("rs" | "py" | "pyi")) {
                out.push(p);
            }
        }
    }

    /// Every `"SUCL_..."`/`"SUCLD_..."` string literal of the workspace's Rust and Python
    /// sources (the names code reads, sets for a child, or names in a message) is a setting of
    /// the table or a constant of the C API.
    #[test]
    fn every_sucl_variable_in_the_sources_is_in_the_table() {
        let root = root();
        let consts = c_constants();
        let mut files = vec![];
        for d in ["crates", "python", "examples", "fuzz", "bench"] {
            sources(&root.join(d), &mut files);
        }
        assert!(files.len() > 50, "found only {} source files under {}", files.len(), root.display());
        let mut missing = BTreeSet::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            for quote in ['"', '\''] {
                for (i, _) in text.match_indices(&format!("{quote}SUCL")) {
                    let rest = &text[i + 1..];
                    let name: String = rest.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
                    let terminated = rest[name.len()..].starts_with(quote);
                    let shaped = ["SUCL_", "SUCLD_"].iter().any(|p| name.len() > p.len() && name.starts_with(p));
                    if terminated && shaped && !consts.contains(&name) && by_env(&name).is_none() {
                        missing.insert(format!("{name} ({})", f.strip_prefix(&root).unwrap().display()));
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "these variables are read in the sources but missing from crates/sucl-runtime/src/settings.rs \
             (add them to SETTINGS, as a test hook if only tests read them, then run scripts/gen-docs.sh):\n  {}",
            missing.into_iter().collect::<Vec<_>>().join("\n  ")
        );
    }

    /// docs/reference/settings.md is `markdown()`. `SUCL_REGEN_DOCS=1` rewrites it.
    #[test]
    fn settings_page_is_current() {
        let path = root().join("docs/reference/settings.md");
        let want = markdown();
        if std::env::var("SUCL_REGEN_DOCS").as_deref() == Ok("1") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(have == want, "{} is stale: run scripts/gen-docs.sh", path.display());
    }
}
