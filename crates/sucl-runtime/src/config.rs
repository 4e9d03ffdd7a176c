//! Settings: built-in defaults, then a TOML file (`SUCL_CONFIG` or `--config`), then `SUCL_*`
//! environment variables, each value remembering where it came from (`sucl info` shows it).
//!
//! One set of settings per job: the settings that shape an algorithm, a memory layout or a wire
//! protocol ([`AGREED_SETTINGS`]: message limit, shm ring/arena/small/chunk sizes, tcp
//! small/piece sizes) and the backend selection policy are rank 0's on every rank. At init rank 0
//! publishes them through the rendezvous store and every other rank adopts them, warning about
//! each value it had different; a record it cannot adopt (another sucl version) fails init with
//! `Error::Mismatch` naming the key and both values.
//!
//! ```toml
//! timeout = 300                 # seconds any wait may block
//! default_backend = "tcp"       # universal fallback: every rank can always use it
//!
//! [platforms.host]
//! backends = ["shm", "tcp"]     # allowed on this platform
//! preferred = "shm"
//! threshold = 0                 # bytes: below, the default backend; 0 always preferred; <0 never
//!
//! [shm]
//! arena_bytes = "8M"
//! dir = "/dev/shm"              # a tmpfs for the segments (SUCL_SHM_DIR)
//!
//! [[tuning]]                    # first matching rule wins (written by `sucl tune`)
//! op = "all_reduce"             # or "*"
//! ranks = [2, 2]                # inclusive
//! bytes = [0, "64K"]            # [from, to)
//! backend = "shm"
//! ```

use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use sucl_core::store::StoreClient;
use sucl_core::{CollOp, Error, Result};
use sucl_host::HostConfig;

/// Names of the backends this build knows. `hier` composes shm inside each host with tcp between
/// hosts (the `hier` module); it carries collectives only.
pub const KNOWN_BACKENDS: [&str; 4] = ["shm", "tcp", "mpi", "hier"];

/// Names of the device-memory backends (tuning rules and `[platforms.cuda]` may name them).
pub const DEVICE_BACKENDS: [&str; 3] = ["nccl", "ipc", "staged"];

/// Which backend carries calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// Chosen per call from the platform, the thresholds and the tuning table.
    Auto,
    /// Always this backend (where it cannot serve a call, the default backend does).
    Named(String),
}

impl BackendChoice {
    /// Parses `auto` or a known backend name.
    pub fn parse(s: &str) -> Option<BackendChoice> {
        let s = s.trim().to_ascii_lowercase();
        if s == "auto" {
            return Some(BackendChoice::Auto);
        }
        KNOWN_BACKENDS.contains(&s.as_str()).then_some(BackendChoice::Named(s))
    }
}

/// The backends a platform may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// Allowed backends.
    pub backends: Vec<String>,
    /// The backend used from `threshold` bytes on.
    pub preferred: String,
    /// SuCL's single threshold: below it the default backend; 0 always the preferred one;
    /// negative never.
    pub threshold: i64,
}

/// One tuning-table rule: for `op` (None = every collective), rank counts in `ranks` and
/// message sizes in `bytes`, use `backend`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    /// The collective, or None for all.
    pub op: Option<String>,
    /// Inclusive rank-count range.
    pub ranks: (usize, usize),
    /// Half-open byte range.
    pub bytes: (u64, u64),
    /// The backend.
    pub backend: String,
}

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The key (`timeout`, `platforms.host.threshold`, ...).
    pub key: String,
    /// Its value, as text.
    pub value: String,
    /// `default`, `file PATH`, or `env VAR`.
    pub from: String,
}

/// Settings of a job.
#[derive(Clone, Debug)]
pub struct Config {
    /// Forced backend or automatic selection (`backend`, `SUCL_BACKEND`).
    pub backend: BackendChoice,
    /// The universal fallback (`default_backend`, `SUCL_DEFAULT_BACKEND`).
    pub default_backend: String,
    /// Per-platform rules (`platforms.NAME`); `host` always exists.
    pub platforms: BTreeMap<String, Platform>,
    /// The tuning table.
    pub tuning: Vec<Rule>,
    /// Host backend settings.
    pub host: HostConfig,
    /// Whether ranks compare every collective's descriptor before running it
    /// (`check_collectives`, `SUCL_CHECK_COLLECTIVES=1`); rank 0's value holds for every rank.
    pub check_collectives: bool,
    /// Whether the wait backoff was set explicitly (`spin_us`, `SUCL_SPIN_US`).
    pub backoff_set: bool,
    /// Whether the host platform's backend list was set (file or `SUCL_BACKENDS`): then every
    /// backend it names must load; the built-in list takes just what is there.
    pub backends_explicit: bool,
    /// The file read, if any.
    pub file: Option<String>,
    /// Every setting with its origin.
    pub sources: Vec<Source>,
}

impl Default for Config {
    fn default() -> Self {
        let mut platforms = BTreeMap::new();
        platforms.insert(
            "host".to_string(),
            Platform { backends: vec!["shm".into(), "tcp".into(), "mpi".into()], preferred: "shm".into(), threshold: 0 },
        );
        let mut c = Config {
            backend: BackendChoice::Auto,
            default_backend: "tcp".into(),
            platforms,
            tuning: vec![],
            host: HostConfig::default(),
            check_collectives: false,
            backoff_set: false,
            backends_explicit: false,
            file: None,
            sources: vec![],
        };
        c.record_all("default");
        c
    }
}

/// Parses a byte size with an optional K, M, G or T suffix (powers of 1024): `64K`, `1M`, `4096`.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
enum Bytes {
    Int(u64),
    Text(String),
}

impl Bytes {
    fn get(&self, key: &str) -> std::result::Result<u64, String> {
        match self {
            Bytes::Int(v) => Ok(*v),
            Bytes::Text(t) => parse_bytes(t).ok_or_else(|| format!("{key}: {t:?} is not a byte size (e.g. 4096, \"64K\", \"8M\")")),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    timeout: Option<f64>,
    spin_us: Option<u64>,
    backend: Option<String>,
    default_backend: Option<String>,
    max_message_bytes: Option<Bytes>,
    max_unexpected_bytes: Option<Bytes>,
    check_collectives: Option<bool>,
    platforms: Option<BTreeMap<String, FilePlatform>>,
    shm: Option<FileShm>,
    tcp: Option<FileTcp>,
    tuning: Option<Vec<FileRule>>,
    // Remote devices' keys: read by sucl-remote (a layer above), accepted here with their types
    // checked so that one file configures both.
    #[allow(dead_code)]
    remote: Option<Vec<FileRemote>>,
    #[allow(dead_code)]
    remote_token_file: Option<String>,
    #[allow(dead_code)]
    remote_tls: Option<bool>,
    #[allow(dead_code)]
    remote_tls_pins: Option<Vec<String>>,
    #[allow(dead_code)]
    remote_tls_certs: Option<Vec<String>>,
}

/// One `[[remote]]` table (its meaning is sucl-remote's).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct FileRemote {
    address: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePlatform {
    backends: Option<Vec<String>>,
    preferred: Option<String>,
    threshold: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShm {
    arena_bytes: Option<Bytes>,
    ring_bytes: Option<Bytes>,
    small_bytes: Option<Bytes>,
    chunk_bytes: Option<Bytes>,
    dir: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTcp {
    small_bytes: Option<Bytes>,
    piece_bytes: Option<Bytes>,
    sockbuf: Option<Bytes>,
    spin_us: Option<u64>,
    poll_first: Option<usize>,
    read_ahead_bytes: Option<Bytes>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRule {
    op: String,
    ranks: Option<(usize, usize)>,
    bytes: (Bytes, Bytes),
    backend: String,
}

/// The line (1-based) of the first occurrence of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> Option<usize> {
    text.lines().position(|l| l.contains(needle)).map(|i| i + 1)
}

impl Config {
    /// Defaults, then the file named by `SUCL_CONFIG` (if set), then the environment.
    pub fn from_env() -> Result<Config> {
        let get = |k: &str| std::env::var(k).ok();
        Config::load(get("SUCL_CONFIG").as_deref(), &get)
    }

    /// Defaults overridden through `get` (a stand-in for the environment; no file).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        Config::load(None, get)
    }

    /// Defaults, then `file` (if any), then the variables `get` returns.
    pub fn load(file: Option<&str>, get: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{path}: cannot read the config file: {e}")))?;
            c.apply_file(path, &text)?;
        }
        c.apply_env(get)?;
        c.validate()?;
        Ok(c)
    }

    /// Parses TOML `text` (named `path` in errors) over the current values.
    pub fn apply_file(&mut self, path: &str, text: &str) -> Result<()> {
        let f: FileConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
            let msg = e.message().to_string();
            // Name the key when the offending line assigns one (type errors omit it).
            let key = line
                .and_then(|l| text.lines().nth(l - 1))
                .and_then(|src| src.split_once('='))
                .map(|(k, _)| k.trim().trim_matches('"'))
                .filter(|k| !k.is_empty() && !msg.contains(&format!("`{k}`")))
                .map(|k| format!("key `{k}`: "))
                .unwrap_or_default();
            match line {
                Some(l) => Error::Config(format!("{path}:{l}: {key}{msg}")),
                None => Error::Config(format!("{path}: {msg}")),
            }
        })?;
        let from = format!("file {path}");
        let at = |needle: &str| line_of(text, needle).map(|l| format!("{path}:{l}")).unwrap_or_else(|| path.to_string());
        let bytes_err = |key: &str, e: String| Error::Config(format!("{}: {e}", at(key)));
        if let Some(t) = f.timeout {
            self.host.timeout = seconds(t).ok_or_else(|| {
                Error::Config(format!("{}: key `timeout`: must be a positive number of seconds (at most {MAX_SECONDS:e})", at("timeout")))
            })?;
            self.record("timeout", &from);
        }
        if let Some(c) = f.check_collectives {
            self.check_collectives = c;
            self.record("check_collectives", &from);
        }
        if let Some(s) = f.spin_us {
            self.host.backoff.spin = Duration::from_micros(s);
            self.backoff_set = true;
            self.record("spin_us", &from);
        }
        if let Some(b) = f.backend {
            self.backend = BackendChoice::parse(&b)
                .ok_or_else(|| Error::Config(format!("{}: key `backend`: unknown backend {b:?} (auto, shm, tcp, mpi)", at("backend"))))?;
            self.record("backend", &from);
        }
        if let Some(b) = f.default_backend {
            self.default_backend = b;
            self.record("default_backend", &from);
        }
        if let Some(m) = f.max_message_bytes {
            self.host.max_message = m.get("max_message_bytes").map_err(|e| bytes_err("max_message_bytes", e))?;
            self.record("max_message_bytes", &from);
        }
        if let Some(m) = f.max_unexpected_bytes {
            self.host.max_unexpected = m
                .get("max_unexpected_bytes")
                .and_then(|b| if b > 0 { Ok(b) } else { Err("max_unexpected_bytes: must be at least 1 byte".into()) })
                .map_err(|e| bytes_err("max_unexpected_bytes", e))?;
            self.record("max_unexpected_bytes", &from);
        }
        for (name, p) in f.platforms.unwrap_or_default() {
            let entry = self.platforms.entry(name.clone()).or_insert_with(|| match name.as_str() {
                "cuda" => {
                    Platform { backends: DEVICE_BACKENDS.iter().map(|b| b.to_string()).collect(), preferred: "nccl".into(), threshold: 0 }
                }
                _ => Platform { backends: vec!["tcp".into()], preferred: "tcp".into(), threshold: 0 },
            });
            if let Some(b) = p.backends {
                entry.backends = b;
                self.backends_explicit |= name == "host";
            }
            match p.preferred {
                Some(pref) => entry.preferred = pref,
                None if !entry.backends.contains(&entry.preferred) => entry.preferred = entry.backends.first().cloned().unwrap_or_default(),
                None => {}
            }
            if let Some(t) = p.threshold {
                entry.threshold = t;
            }
            self.record(&format!("platforms.{name}"), &from);
        }
        let mut recorded: Vec<&str> = vec![];
        if let Some(mut s) = f.shm {
            if let Some(dir) = s.dir.take() {
                self.host.shm_dir = check_shm_dir(&dir).map_err(|e| Error::Config(format!("{}: key `shm.dir`: {e}", at("dir"))))?;
                recorded.push("shm.dir");
            }
            for (key, v, dst) in [
                ("shm.arena_bytes", s.arena_bytes, &mut self.host.shm_arena_bytes),
                ("shm.ring_bytes", s.ring_bytes, &mut self.host.shm_ring_bytes),
                ("shm.small_bytes", s.small_bytes, &mut self.host.shm_small_bytes),
                ("shm.chunk_bytes", s.chunk_bytes, &mut self.host.shm_chunk_bytes),
            ] {
                if let Some(v) = v {
                    *dst = v.get(key).map_err(|e| bytes_err(key.split('.').nth(1).unwrap(), e))? as usize;
                    recorded.push(key);
                }
            }
        }
        if let Some(t) = f.tcp {
            for (key, v, dst) in [
                ("tcp.small_bytes", t.small_bytes, &mut self.host.algo.small_bytes),
                ("tcp.piece_bytes", t.piece_bytes, &mut self.host.algo.piece_bytes),
                ("tcp.sockbuf", t.sockbuf, &mut self.host.tcp_sockbuf),
                ("tcp.read_ahead_bytes", t.read_ahead_bytes, &mut self.host.tcp_read_ahead),
            ] {
                if let Some(v) = v {
                    *dst = v.get(key).map_err(|e| bytes_err(key.split('.').nth(1).unwrap(), e))? as usize;
                    recorded.push(key);
                }
            }
            if let Some(s) = t.spin_us {
                self.host.tcp_spin = Duration::from_micros(s);
                self.record("tcp.spin_us", &from);
            }
            if let Some(b) = t.poll_first {
                self.host.tcp_poll_first = b;
                self.record("tcp.poll_first", &from);
            }
        }
        for key in recorded {
            self.record(key, &from);
        }
        if let Some(rules) = f.tuning {
            self.tuning.clear();
            for r in rules {
                let op = if r.op == "*" {
                    None
                } else {
                    CollOp::parse(&r.op).ok_or_else(|| {
                        Error::Config(format!("{}: key `tuning.op`: unknown operation {:?}", at(&format!("\"{}\"", r.op)), r.op))
                    })?;
                    Some(r.op.clone())
                };
                let lo = r.bytes.0.get("tuning.bytes").map_err(|e| bytes_err("bytes", e))?;
                let hi = r.bytes.1.get("tuning.bytes").map_err(|e| bytes_err("bytes", e))?;
                if lo > hi {
                    return Err(Error::Config(format!("{}: key `tuning.bytes`: [{lo}, {hi}) is empty", at("bytes"))));
                }
                let ranks = r.ranks.unwrap_or((1, usize::MAX));
                self.tuning.push(Rule { op, ranks, bytes: (lo, hi), backend: r.backend });
            }
            self.record("tuning", &from);
        }
        self.file = Some(path.to_string());
        // Backend names are checked here, where the file's lines are known.
        for (key, name) in self.backend_names() {
            if !KNOWN_BACKENDS.contains(&name.as_str()) && !DEVICE_BACKENDS.contains(&name.as_str()) {
                return Err(Error::Config(format!(
                    "{}: key `{key}`: unknown backend {name:?} (known: {})",
                    at(&format!("\"{name}\"")),
                    KNOWN_BACKENDS.join(", ")
                )));
            }
        }
        Ok(())
    }

    fn backend_names(&self) -> Vec<(String, String)> {
        let mut v = vec![("default_backend".to_string(), self.default_backend.clone())];
        for (n, p) in &self.platforms {
            v.extend(p.backends.iter().map(|b| (format!("platforms.{n}.backends"), b.clone())));
            v.push((format!("platforms.{n}.preferred"), p.preferred.clone()));
        }
        v.extend(self.tuning.iter().map(|r| ("tuning.backend".to_string(), r.backend.clone())));
        v
    }

    /// `SUCL_IPC`: `off` (or `0`) drops the peer-memory backend from the cuda platform; `force`
    /// puts a rule first in the tuning table that sends every device collective it serves to it
    /// (the others go where they would without it); `auto` (or `1`) leaves the choice to the
    /// table and the defaults.
    fn apply_ipc_env(&mut self, v: &str) -> std::result::Result<(), &'static str> {
        let cuda = self.platforms.entry("cuda".into()).or_insert_with(|| Platform {
            backends: DEVICE_BACKENDS.iter().map(|b| b.to_string()).collect(),
            preferred: "nccl".into(),
            threshold: 0,
        });
        match v.trim() {
            "off" | "0" => cuda.backends.retain(|b| b != "ipc"),
            "auto" | "on" | "1" | "force" => {
                if !cuda.backends.iter().any(|b| b == "ipc") {
                    cuda.backends.insert(0, "ipc".into());
                }
                if v.trim() == "force" {
                    let all = Rule { op: None, ranks: (1, usize::MAX), bytes: (0, u64::MAX), backend: "ipc".into() };
                    self.tuning.insert(0, all);
                }
            }
            _ => return Err("off, auto or force"),
        }
        Ok(())
    }

    fn apply_env(&mut self, get: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        let bad = |k: &str, v: &str, want: &str| Error::Config(format!("environment variable {k}={v:?}: expected {want}"));
        if let Some(v) = get("SUCL_BACKEND") {
            self.backend = BackendChoice::parse(&v).ok_or_else(|| bad("SUCL_BACKEND", &v, "auto, shm, tcp, mpi or hier"))?;
            self.record("backend", "env SUCL_BACKEND");
        }
        if let Some(v) = get("SUCL_DEFAULT_BACKEND") {
            if !KNOWN_BACKENDS.contains(&v.as_str()) || v == "hier" {
                return Err(bad("SUCL_DEFAULT_BACKEND", &v, "tcp or mpi"));
            }
            self.default_backend = v;
            self.record("default_backend", "env SUCL_DEFAULT_BACKEND");
        }
        if let Some(v) = get("SUCL_BACKENDS") {
            let list: Vec<String> = v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
            if let Some(b) = list.iter().find(|b| !KNOWN_BACKENDS.contains(&b.as_str())) {
                return Err(bad("SUCL_BACKENDS", &v, &format!("a comma-separated list of {} (not {b:?})", KNOWN_BACKENDS.join(", "))));
            }
            let host = self.platforms.get_mut("host").expect("host platform");
            if !list.contains(&host.preferred) {
                host.preferred = list.first().cloned().unwrap_or_default();
            }
            host.backends = list;
            self.backends_explicit = true;
            self.record("platforms.host", "env SUCL_BACKENDS");
        }
        if let Some(v) = get("SUCL_IPC") {
            self.apply_ipc_env(&v).map_err(|want| bad("SUCL_IPC", &v, want))?;
            self.record("platforms.cuda", "env SUCL_IPC");
        }
        if let Some(v) = get("SUCL_THRESHOLD") {
            let t: i64 = v
                .trim()
                .parse()
                .map_err(|_| bad("SUCL_THRESHOLD", &v, "an integer number of bytes (0: always the preferred backend, negative: never)"))?;
            self.platforms.get_mut("host").expect("host platform").threshold = t;
            self.record("platforms.host", "env SUCL_THRESHOLD");
        }
        if let Some(v) = get("SUCL_TIMEOUT") {
            self.host.timeout = v
                .trim()
                .parse()
                .ok()
                .and_then(seconds)
                .ok_or_else(|| bad("SUCL_TIMEOUT", &v, &format!("a positive number of seconds (at most {MAX_SECONDS:e})")))?;
            self.record("timeout", "env SUCL_TIMEOUT");
        }
        let mut sizes: Vec<(&str, &str, &mut usize, u64)> = vec![
            ("SUCL_SHM_RING_BYTES", "shm.ring_bytes", &mut self.host.shm_ring_bytes, 4096),
            ("SUCL_SHM_ARENA_BYTES", "shm.arena_bytes", &mut self.host.shm_arena_bytes, 8192),
            ("SUCL_SHM_SMALL_BYTES", "shm.small_bytes", &mut self.host.shm_small_bytes, 0),
            ("SUCL_SHM_CHUNK_BYTES", "shm.chunk_bytes", &mut self.host.shm_chunk_bytes, 4096),
            ("SUCL_TCP_SMALL_BYTES", "tcp.small_bytes", &mut self.host.algo.small_bytes, 0),
            ("SUCL_TCP_PIECE_BYTES", "tcp.piece_bytes", &mut self.host.algo.piece_bytes, 1024),
            ("SUCL_TCP_SOCKBUF", "tcp.sockbuf", &mut self.host.tcp_sockbuf, 0),
            ("SUCL_TCP_READ_AHEAD_BYTES", "tcp.read_ahead_bytes", &mut self.host.tcp_read_ahead, 0),
        ];
        let mut set = vec![];
        for (var, key, dst, min) in sizes.iter_mut() {
            if let Some(v) = get(var) {
                let b = parse_bytes(&v)
                    .filter(|b| b >= min)
                    .ok_or_else(|| bad(var, &v, &format!("a byte size of at least {min} (suffixes K, M, G)")))?;
                **dst = b as usize;
                set.push((key.to_string(), format!("env {var}")));
            }
        }
        drop(sizes);
        for (k, f) in set {
            self.record(&k, &f);
        }
        if let Some(v) = get("SUCL_MAX_MESSAGE_BYTES") {
            self.host.max_message = parse_bytes(&v).filter(|b| *b > 0).ok_or_else(|| bad("SUCL_MAX_MESSAGE_BYTES", &v, "a byte size"))?;
            self.record("max_message_bytes", "env SUCL_MAX_MESSAGE_BYTES");
        }
        if let Some(v) = get("SUCL_MAX_UNEXPECTED_BYTES") {
            self.host.max_unexpected =
                parse_bytes(&v).filter(|b| *b > 0).ok_or_else(|| bad("SUCL_MAX_UNEXPECTED_BYTES", &v, "a byte size"))?;
            self.record("max_unexpected_bytes", "env SUCL_MAX_UNEXPECTED_BYTES");
        }
        if let Some(v) = get("SUCL_CHECK_COLLECTIVES") {
            self.check_collectives = match v.trim() {
                "1" | "true" | "on" | "yes" => true,
                "0" | "false" | "off" | "no" | "" => false,
                _ => return Err(bad("SUCL_CHECK_COLLECTIVES", &v, "1 or 0")),
            };
            self.record("check_collectives", "env SUCL_CHECK_COLLECTIVES");
        }
        if let Some(v) = get("SUCL_SHM_DIR") {
            self.host.shm_dir = check_shm_dir(&v).map_err(|e| bad("SUCL_SHM_DIR", &v, &e))?;
            self.record("shm.dir", "env SUCL_SHM_DIR");
        }
        if let Some(v) = get("SUCL_TCP_SPIN_US") {
            self.host.tcp_spin = Duration::from_micros(v.trim().parse().map_err(|_| bad("SUCL_TCP_SPIN_US", &v, "microseconds"))?);
            self.record("tcp.spin_us", "env SUCL_TCP_SPIN_US");
        }
        if let Some(v) = get("SUCL_TCP_POLL_FIRST") {
            self.host.tcp_poll_first =
                v.trim().parse().map_err(|_| bad("SUCL_TCP_POLL_FIRST", &v, "a number of peer sockets (0: never poll first)"))?;
            self.record("tcp.poll_first", "env SUCL_TCP_POLL_FIRST");
        }
        if let Some(v) = get("SUCL_SPIN_US") {
            self.host.backoff.spin =
                Duration::from_micros(v.trim().parse().map_err(|_| bad("SUCL_SPIN_US", &v, "microseconds of busy-polling"))?);
            self.backoff_set = true;
            self.record("spin_us", "env SUCL_SPIN_US");
        }
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        let universal = ["tcp", "mpi"];
        if !universal.contains(&self.default_backend.as_str()) {
            return Err(Error::Config(format!(
                "default_backend = {:?}: the default must be a backend every rank can use (tcp or mpi){}",
                self.default_backend,
                self.file.as_ref().map(|f| format!(" (set in {f} or SUCL_DEFAULT_BACKEND)")).unwrap_or_default()
            )));
        }
        if self.host.tcp_read_ahead > sucl_host::tcp::MAX_READ_AHEAD {
            let from = self.sources.iter().find(|s| s.key == "tcp.read_ahead_bytes").map_or("default", |s| s.from.as_str());
            return Err(Error::Config(format!(
                "tcp.read_ahead_bytes = {} (from {from}): at most {} bytes (every connection allocates it)",
                self.host.tcp_read_ahead,
                sucl_host::tcp::MAX_READ_AHEAD
            )));
        }
        for (n, p) in &self.platforms {
            if !p.backends.contains(&p.preferred) && !p.backends.is_empty() {
                return Err(Error::Config(format!(
                    "platforms.{n}.preferred = {:?} is not among platforms.{n}.backends {:?}",
                    p.preferred, p.backends
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn value_of(&self, key: &str) -> String {
        match key {
            "timeout" => format!("{}", self.host.timeout.as_secs_f64()),
            "spin_us" => format!("{}", self.host.backoff.spin.as_micros()),
            "backend" => match &self.backend {
                BackendChoice::Auto => "auto".into(),
                BackendChoice::Named(n) => n.clone(),
            },
            "default_backend" => self.default_backend.clone(),
            "max_message_bytes" => self.host.max_message.to_string(),
            "max_unexpected_bytes" => self.host.max_unexpected.to_string(),
            "shm.arena_bytes" => self.host.shm_arena_bytes.to_string(),
            "shm.ring_bytes" => self.host.shm_ring_bytes.to_string(),
            "shm.small_bytes" => self.host.shm_small_bytes.to_string(),
            "shm.chunk_bytes" => self.host.shm_chunk_bytes.to_string(),
            "shm.dir" => self.host.shm_dir.clone(),
            "tcp.small_bytes" => self.host.algo.small_bytes.to_string(),
            "tcp.piece_bytes" => self.host.algo.piece_bytes.to_string(),
            "tcp.sockbuf" => self.host.tcp_sockbuf.to_string(),
            "tcp.spin_us" => self.host.tcp_spin.as_micros().to_string(),
            "tcp.poll_first" => self.host.tcp_poll_first.to_string(),
            "tcp.read_ahead_bytes" => self.host.tcp_read_ahead.to_string(),
            "tuning" => format!("{} rules", self.tuning.len()),
            k if k.starts_with("platforms.") => {
                let p = &self.platforms[&k["platforms.".len()..]];
                format!("backends {:?}, preferred {}, threshold {}", p.backends, p.preferred, p.threshold)
            }
            _ => String::new(),
        }
    }

    fn record(&mut self, key: &str, from: &str) {
        let value = self.value_of(key);
        match self.sources.iter_mut().find(|s| s.key == key) {
            Some(s) => {
                s.value = value;
                s.from = from.to_string();
            }
            None => self.sources.push(Source { key: key.into(), value, from: from.into() }),
        }
    }

    fn record_all(&mut self, from: &str) {
        for k in [
            "backend",
            "default_backend",
            "platforms.host",
            "timeout",
            "spin_us",
            "max_message_bytes",
            "shm.arena_bytes",
            "shm.ring_bytes",
            "shm.small_bytes",
            "shm.chunk_bytes",
            "shm.dir",
            "tcp.small_bytes",
            "tcp.piece_bytes",
            "tcp.sockbuf",
            "tcp.spin_us",
            "tcp.poll_first",
            "tcp.read_ahead_bytes",
            "check_collectives",
            "tuning",
        ] {
            self.record(k, from);
        }
    }
}

/// A directory for shared-memory segments: an absolute path to an existing directory.
fn check_shm_dir(dir: &str) -> std::result::Result<String, String> {
    let dir = dir.trim_end_matches('/');
    let dir = if dir.is_empty() { "/" } else { dir };
    if !dir.starts_with('/') {
        return Err("an absolute path to a directory (a tmpfs such as /dev/shm)".into());
    }
    if !std::path::Path::new(dir).is_dir() {
        return Err(format!("an existing directory ({dir} is not one)"));
    }
    Ok(dir.to_string())
}

/// Settings that change an algorithm, a memory layout or a wire protocol, with the least value
/// each may take. Every rank of a job uses rank 0's values (see [`agree_settings`]), as it uses
/// rank 0's backend selection policy; the rest (timeouts, spinning, socket buffers, the shm
/// directory, whose segment path rank 0 hands out anyway) may differ per rank.
pub const AGREED_SETTINGS: [(&str, u64); 7] = [
    ("max_message_bytes", 1),
    ("shm.ring_bytes", 4096),
    ("shm.arena_bytes", 8192),
    ("shm.small_bytes", 0),
    ("shm.chunk_bytes", 4096),
    ("tcp.small_bytes", 0),
    ("tcp.piece_bytes", 1024),
];

impl Config {
    fn agreed_slot(&mut self, key: &str) -> Option<&mut usize> {
        Some(match key {
            "shm.ring_bytes" => &mut self.host.shm_ring_bytes,
            "shm.arena_bytes" => &mut self.host.shm_arena_bytes,
            "shm.small_bytes" => &mut self.host.shm_small_bytes,
            "shm.chunk_bytes" => &mut self.host.shm_chunk_bytes,
            "tcp.small_bytes" => &mut self.host.algo.small_bytes,
            "tcp.piece_bytes" => &mut self.host.algo.piece_bytes,
            _ => return None,
        })
    }

    fn agreed_value(&mut self, key: &str) -> u64 {
        match key {
            "max_message_bytes" => self.host.max_message,
            k => *self.agreed_slot(k).expect("an agreed setting") as u64,
        }
    }

    /// The agreed settings ([`AGREED_SETTINGS`]) as `key=value` lines: what rank 0 publishes.
    pub fn agreed_settings(&self) -> String {
        let mut c = self.clone();
        AGREED_SETTINGS.iter().map(|(k, _)| format!("{k}={}\n", c.agreed_value(k))).collect()
    }

    /// Adopts rank 0's agreed settings (`published`, as [`Config::agreed_settings`] writes
    /// them); returns `(key, this rank's value, rank 0's)` for every value that changed. A record
    /// this rank cannot adopt — a key missing, unknown or with a value it cannot take (a
    /// different sucl version) — is [`Error::Mismatch`] naming the key and both values.
    pub fn adopt_agreed_settings(&mut self, published: &str, rank: usize) -> Result<Vec<(&'static str, u64, u64)>> {
        let mismatch = |key: &str, theirs: &str, mine: String| Error::Mismatch {
            rank,
            what: format!("setting {key}: rank 0 has {theirs}, rank {rank} has {mine} (and cannot adopt rank 0's)"),
        };
        let mut theirs: BTreeMap<&str, &str> = BTreeMap::new();
        for line in published.lines().filter(|l| !l.is_empty()) {
            let (k, v) = line.split_once('=').ok_or_else(|| mismatch("(unreadable record)", line, "a key=value record".into()))?;
            if !AGREED_SETTINGS.iter().any(|(a, _)| *a == k) {
                return Err(mismatch(k, v, "no such setting".into()));
            }
            theirs.insert(k, v);
        }
        let mut changed = vec![];
        for (key, min) in AGREED_SETTINGS {
            let mine = self.agreed_value(key);
            let Some(v) = theirs.get(key) else { return Err(mismatch(key, "no such setting", mine.to_string())) };
            let v: u64 = v
                .parse()
                .ok()
                .filter(|v| *v >= min)
                .filter(|v| key == "max_message_bytes" || usize::try_from(*v).is_ok())
                .ok_or_else(|| mismatch(key, v, mine.to_string()))?;
            if v == mine {
                continue;
            }
            match self.agreed_slot(key) {
                Some(slot) => *slot = v as usize,
                None => self.host.max_message = v,
            }
            let from = self.sources.iter().find(|s| s.key == key).map(|s| s.from.clone()).unwrap_or_default();
            self.record(key, &format!("rank 0 (this rank's {mine} from {from} not used)"));
            changed.push((key, mine, v));
        }
        Ok(changed)
    }
}

/// Makes every rank of a job use rank 0's agreed settings ([`AGREED_SETTINGS`]): rank 0
/// publishes them through the rendezvous store, every other rank adopts them, warning about each
/// value it had different (key, its value, rank 0's). Collective; called by `init`.
pub fn agree_settings(cfg: &mut Config, store: &StoreClient, rank: usize) -> Result<()> {
    const KEY: &str = "world/settings";
    if rank == 0 {
        return store.set(KEY, cfg.agreed_settings().as_bytes());
    }
    let published = store.get(KEY)?;
    let published = String::from_utf8_lossy(&published);
    for (key, mine, theirs) in cfg.adopt_agreed_settings(&published, rank)? {
        tracing::warn!(rank, "setting {key} differs from rank 0's: using rank 0's {theirs} instead of this rank's {mine}");
    }
    Ok(())
}

/// Entry point of the coverage-guided fuzz target `config_toml` (`fuzz/`) and of the tests
/// that replay its corpus: not part of the API.
/// The longest timeout taken, in seconds (about 3170 years: far below what a `Duration` holds,
/// and what `Instant` arithmetic can add to the present without overflowing).
pub const MAX_SECONDS: f64 = 1e11;

/// `s` seconds as a timeout: positive, finite and at most [`MAX_SECONDS`], else `None`.
pub fn seconds(s: f64) -> Option<Duration> {
    (s > 0.0 && s <= MAX_SECONDS).then(|| Duration::from_secs_f64(s))
}

#[doc(hidden)]
pub mod fuzz {
    use super::*;

    /// `bytes` (if UTF-8) as a config file over the defaults, then validated: a config or a
    /// clear error, never a panic.
    pub fn config_toml(bytes: &[u8]) {
        let Ok(text) = std::str::from_utf8(bytes) else { return };
        let mut c = Config::default();
        if c.apply_file("fuzz.toml", text).is_ok() {
            let _ = c.validate();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Result<Config> {
        let mut c = Config::default();
        c.apply_file("sucl.toml", text)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn timeouts_beyond_what_a_duration_holds_are_refused_not_a_panic() {
        for t in ["3e19", "1e300", "inf", "nan", "0", "-1"] {
            let e = file(&format!("timeout = {t}\n")).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains("timeout"), "{t}: {e}");
        }
        assert_eq!(file("timeout = 1e11\n").unwrap().host.timeout, Duration::from_secs(100_000_000_000));
        let mut c = Config::default();
        let e = c.apply_env(&|k| (k == "SUCL_TIMEOUT").then(|| "1e20".to_string())).unwrap_err().to_string();
        assert!(e.contains("SUCL_TIMEOUT"), "{e}");
    }

    #[test]
    fn remote_device_keys_are_accepted_and_typed() {
        let text = "backend = \"shm\"\nremote_token_file = \"/tmp/t\"\nremote_tls_pins = [\"ab\"]\n[[remote]]\naddress = \"h:1\"\n";
        assert!(file(text).is_ok(), "{:?}", file(text).err());
        let e = file("[[remote]]\nadress = \"h:1\"\n").unwrap_err().to_string();
        assert!(e.contains("adress"), "{e}");
        let e = file("remote_tls = \"yes\"\n").unwrap_err().to_string();
        assert!(e.contains("remote_tls"), "{e}");
    }

    #[test]
    fn max_unexpected_bytes_is_a_file_key() {
        let c = file("max_unexpected_bytes = \"64M\"\n").unwrap();
        assert_eq!(c.host.max_unexpected, 64 << 20);
        assert!(c.sources.iter().any(|s| s.key == "max_unexpected_bytes" && s.from.starts_with("file")));
        let e = file("max_unexpected_bytes = 0\n").unwrap_err().to_string();
        assert!(e.contains("max_unexpected_bytes") && e.contains("at least 1 byte"), "{e}");
    }

    #[test]
    fn sizes_and_env_errors() {
        assert_eq!(parse_bytes("64K"), Some(65536));
        assert_eq!(parse_bytes("2m"), Some(2 << 20));
        assert_eq!(parse_bytes("7"), Some(7));
        assert_eq!(parse_bytes("x"), None);
        let c = Config::from_lookup(&|k| (k == "SUCL_TIMEOUT").then(|| "2.5".to_string())).unwrap();
        assert_eq!(c.host.timeout, Duration::from_millis(2500));
        assert!(c.sources.iter().any(|s| s.key == "timeout" && s.from == "env SUCL_TIMEOUT"));
        let e = Config::from_lookup(&|k| (k == "SUCL_BACKEND").then(|| "carrier-pigeon".to_string())).unwrap_err().to_string();
        assert!(e.contains("SUCL_BACKEND") && e.contains("carrier-pigeon"), "{e}");
        let e = Config::from_lookup(&|k| (k == "SUCL_SHM_RING_BYTES").then(|| "12".to_string())).unwrap_err().to_string();
        assert!(e.contains("at least 4096"), "{e}");
        let e = Config::from_lookup(&|k| (k == "SUCL_THRESHOLD").then(|| "lots".to_string())).unwrap_err().to_string();
        assert!(e.contains("SUCL_THRESHOLD"), "{e}");
    }

    #[test]
    fn tcp_polling_and_read_ahead_settings() {
        let with = |k: &'static str, v: &'static str| Config::from_lookup(&move |q| (q == k).then(|| v.to_string()));
        assert_eq!(Config::default().host.tcp_poll_first, 2, "from two peers by default");
        assert_eq!(with("SUCL_TCP_POLL_FIRST", "0").unwrap().host.tcp_poll_first, 0);
        let e = with("SUCL_TCP_POLL_FIRST", "sometimes").unwrap_err().to_string();
        assert!(e.contains("SUCL_TCP_POLL_FIRST") && e.contains("number of peer sockets"), "{e}");
        assert_eq!(with("SUCL_TCP_READ_AHEAD_BYTES", "0").unwrap().host.tcp_read_ahead, 0);
        assert_eq!(with("SUCL_TCP_READ_AHEAD_BYTES", "64K").unwrap().host.tcp_read_ahead, 65536);
        let e = with("SUCL_TCP_READ_AHEAD_BYTES", "2M").unwrap_err().to_string();
        assert!(e.contains("tcp.read_ahead_bytes") && e.contains("at most 1048576") && e.contains("SUCL_TCP_READ_AHEAD_BYTES"), "{e}");
        let c = file("[tcp]\npoll_first = 1\nread_ahead_bytes = \"1K\"\n").unwrap();
        assert!(c.host.tcp_poll_first == 1 && c.host.tcp_read_ahead == 1024);
        assert!(file("[tcp]\nread_ahead_bytes = \"4M\"\n").unwrap_err().to_string().contains("at most"));
    }

    #[test]
    fn a_full_file_parses_and_records_sources() {
        let c = file(
            r#"
timeout = 12
default_backend = "tcp"
[platforms.host]
backends = ["shm", "tcp"]
preferred = "shm"
threshold = 65536
[shm]
arena_bytes = "4M"
[[tuning]]
op = "all_reduce"
ranks = [2, 4]
bytes = [0, "64K"]
backend = "tcp"
"#,
        )
        .unwrap();
        assert_eq!(c.platforms["host"].threshold, 65536);
        assert_eq!(c.host.shm_arena_bytes, 4 << 20);
        assert_eq!(c.tuning, vec![Rule { op: Some("all_reduce".into()), ranks: (2, 4), bytes: (0, 65536), backend: "tcp".into() }]);
        assert!(c.sources.iter().any(|s| s.key == "shm.arena_bytes" && s.from == "file sucl.toml"));
    }

    #[test]
    fn sucl_ipc_disables_forces_or_leaves_peer_memory() {
        let with = |v: &str| Config::from_lookup(&|k| (k == "SUCL_IPC").then(|| v.to_string()));
        let has_ipc = |c: &Config| c.platforms.get("cuda").is_none_or(|p| p.backends.iter().any(|b| b == "ipc"));
        let off = with("off").unwrap();
        assert!(!has_ipc(&off), "off drops ipc from the cuda platform");
        assert!(off.platforms["cuda"].backends.iter().any(|b| b == "nccl"), "and keeps the others");
        let forced = with("force").unwrap();
        assert!(has_ipc(&forced));
        assert_eq!(forced.tuning.first().map(|r| (r.backend.as_str(), r.op.clone(), r.bytes)), Some(("ipc", None, (0, u64::MAX))));
        let auto = with("auto").unwrap();
        assert!(has_ipc(&auto) && auto.tuning.is_empty());
        assert!(has_ipc(&Config::from_lookup(&|_| None).unwrap()), "on by default");
        let e = with("sometimes").unwrap_err().to_string();
        assert!(e.contains("SUCL_IPC") && e.contains("off, auto or force"), "{e}");
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        let e = file("timeout = 3\n[shm\narena_bytes = 1\n").unwrap_err().to_string();
        assert!(e.contains("sucl.toml:2"), "{e}");
    }

    #[test]
    fn unknown_keys_and_backends_name_file_line_and_key() {
        let e = file("timeout = 3\ntimeot = 4\n").unwrap_err().to_string();
        assert!(e.contains("sucl.toml:2") && e.contains("timeot"), "{e}");
        let e = file("[platforms.host]\nbackends = [\"shm\", \"carrier\"]\npreferred = \"shm\"\n").unwrap_err().to_string();
        assert!(e.contains("sucl.toml:2") && e.contains("platforms.host.backends") && e.contains("carrier"), "{e}");
        let e = file("[shm]\nbogus = 1\n").unwrap_err().to_string();
        assert!(e.contains("sucl.toml:2") && e.contains("bogus"), "{e}");
    }

    #[test]
    fn threshold_must_be_a_number() {
        let e = file("[platforms.host]\nthreshold = \"big\"\n").unwrap_err().to_string();
        assert!(e.contains("sucl.toml:2") && e.contains("threshold"), "{e}");
        let e = file("[platforms.host]\nthreshold = 1.5\n").unwrap_err().to_string();
        assert!(e.contains("sucl.toml:2"), "{e}");
    }

    #[test]
    fn default_backend_must_be_universal() {
        let e = file("default_backend = \"shm\"\n").unwrap_err().to_string();
        assert!(e.contains("default_backend") && e.contains("tcp or mpi"), "{e}");
    }

    #[test]
    fn agreed_settings_are_adopted_from_rank_0() {
        let rank0 = Config::from_lookup(&|k| (k == "SUCL_SHM_SMALL_BYTES").then(|| "0".to_string())).unwrap();
        let mut mine = Config::from_lookup(&|k| match k {
            "SUCL_SHM_RING_BYTES" => Some("1M".into()),
            "SUCL_TCP_PIECE_BYTES" => Some("4K".into()),
            _ => None,
        })
        .unwrap();
        let changed = mine.adopt_agreed_settings(&rank0.agreed_settings(), 1).unwrap();
        assert_eq!(
            changed,
            vec![("shm.ring_bytes", 1 << 20, 512 << 10), ("shm.small_bytes", 16 << 10, 0), ("tcp.piece_bytes", 4096, 256 << 10)]
        );
        assert_eq!(mine.agreed_settings(), rank0.agreed_settings());
        assert_eq!((mine.host.shm_ring_bytes, mine.host.shm_small_bytes, mine.host.algo.piece_bytes), (512 << 10, 0, 256 << 10));
        let src = mine.sources.iter().find(|s| s.key == "shm.ring_bytes").unwrap();
        assert!(src.from.starts_with("rank 0") && src.from.contains("1048576"), "{src:?}");
        // The same settings: nothing changes.
        assert!(mine.adopt_agreed_settings(&rank0.agreed_settings(), 1).unwrap().is_empty());
    }

    #[test]
    fn settings_rank_1_cannot_adopt_are_a_mismatch_naming_key_and_values() {
        let mut mine = Config::default();
        let full = Config::default().agreed_settings();
        // A record from another sucl version: a key this one lacks, or one missing.
        let e = mine.adopt_agreed_settings(&format!("{full}shm.future_bytes=7\n"), 1).unwrap_err();
        assert!(matches!(e, Error::Mismatch { .. }) && e.to_string().contains("shm.future_bytes: rank 0 has 7"), "{e}");
        let without_chunk: String = full.lines().filter(|l| !l.starts_with("shm.chunk_bytes")).map(|l| format!("{l}\n")).collect();
        let e = mine.adopt_agreed_settings(&without_chunk, 2).unwrap_err().to_string();
        assert!(e.contains("shm.chunk_bytes: rank 0 has no such setting, rank 2 has 262144"), "{e}");
        // A value this rank cannot take.
        let e = mine.adopt_agreed_settings(&full.replace("shm.ring_bytes=524288", "shm.ring_bytes=12"), 1).unwrap_err().to_string();
        assert!(e.contains("shm.ring_bytes: rank 0 has 12, rank 1 has 524288"), "{e}");
    }

    #[test]
    fn shm_dir_must_be_an_existing_absolute_directory() {
        let c = Config::from_lookup(&|k| (k == "SUCL_SHM_DIR").then(|| "/tmp/".to_string())).unwrap();
        assert_eq!(c.host.shm_dir, "/tmp");
        let e = Config::from_lookup(&|k| (k == "SUCL_SHM_DIR").then(|| "/no/such/dir".to_string())).unwrap_err().to_string();
        assert!(e.contains("SUCL_SHM_DIR") && e.contains("not one"), "{e}");
        let e = file("[shm]\ndir = \"relative\"\n").unwrap_err().to_string();
        assert!(e.contains("sucl.toml:2") && e.contains("shm.dir"), "{e}");
    }
}
