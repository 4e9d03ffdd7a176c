//! Runtime settings, from `SUCL_*` environment variables over built-in defaults.

use std::time::Duration;
use sucl_core::{Error, Result};
use sucl_host::HostConfig;

/// Which backend carries host-memory calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// Shared memory when every rank is on one host, TCP otherwise.
    Auto,
    /// Shared memory (all ranks on one host).
    Shm,
    /// TCP.
    Tcp,
}

impl BackendChoice {
    /// Parses `auto`, `shm` or `tcp`.
    pub fn parse(s: &str) -> Option<BackendChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(BackendChoice::Auto),
            "shm" => Some(BackendChoice::Shm),
            "tcp" => Some(BackendChoice::Tcp),
            _ => None,
        }
    }
}

/// Settings of a communicator.
#[derive(Clone, Debug)]
pub struct Config {
    /// Backend choice (`SUCL_BACKEND`).
    pub backend: BackendChoice,
    /// Host backend settings (`SUCL_TIMEOUT`, `SUCL_SHM_*`, `SUCL_TCP_*`, `SUCL_MAX_MESSAGE_BYTES`).
    pub host: HostConfig,
    /// Whether the wait backoff was set explicitly (`SUCL_SPIN_US`); otherwise it follows
    /// whether this host's ranks outnumber its cores.
    pub backoff_set: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { backend: BackendChoice::Auto, host: HostConfig::default(), backoff_set: false }
    }
}

/// Parses a byte size with an optional K, M or G suffix (powers of 1024): `64K`, `1M`, `4096`.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

impl Config {
    /// Defaults overridden by the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Defaults overridden through `get` (a stand-in for the environment).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        let bad = |k: &str, v: &str, want: &str| Error::Config(format!("{k}={v:?}: expected {want}"));
        if let Some(v) = get("SUCL_BACKEND") {
            c.backend = BackendChoice::parse(&v).ok_or_else(|| bad("SUCL_BACKEND", &v, "auto, shm or tcp"))?;
        }
        if let Some(v) = get("SUCL_TIMEOUT") {
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| *s > 0.0 && s.is_finite())
                .ok_or_else(|| bad("SUCL_TIMEOUT", &v, "a positive number of seconds"))?;
            c.host.timeout = Duration::from_secs_f64(secs);
        }
        let size = |k: &str, dst: &mut usize, min: u64| -> Result<()> {
            if let Some(v) = get(k) {
                let b = parse_bytes(&v)
                    .filter(|b| *b >= min)
                    .ok_or_else(|| bad(k, &v, &format!("a byte size of at least {min} (suffixes K, M, G)")))?;
                *dst = b as usize;
            }
            Ok(())
        };
        size("SUCL_SHM_RING_BYTES", &mut c.host.shm_ring_bytes, 4096)?;
        size("SUCL_SHM_ARENA_BYTES", &mut c.host.shm_arena_bytes, 8192)?;
        size("SUCL_SHM_SMALL_BYTES", &mut c.host.shm_small_bytes, 0)?;
        size("SUCL_SHM_CHUNK_BYTES", &mut c.host.shm_chunk_bytes, 4096)?;
        size("SUCL_TCP_SMALL_BYTES", &mut c.host.algo.small_bytes, 0)?;
        size("SUCL_TCP_PIECE_BYTES", &mut c.host.algo.piece_bytes, 1024)?;
        size("SUCL_TCP_SOCKBUF", &mut c.host.tcp_sockbuf, 0)?;
        if let Some(v) = get("SUCL_TCP_SPIN_US") {
            let us: u64 = v.trim().parse().map_err(|_| bad("SUCL_TCP_SPIN_US", &v, "microseconds"))?;
            c.host.tcp_spin = Duration::from_micros(us);
        }
        if let Some(v) = get("SUCL_SPIN_US") {
            let us: u64 = v.trim().parse().map_err(|_| bad("SUCL_SPIN_US", &v, "microseconds of busy-polling before yielding"))?;
            c.host.backoff.spin = Duration::from_micros(us);
            c.backoff_set = true;
        }
        let mut mm = c.host.max_message as usize;
        size("SUCL_MAX_MESSAGE_BYTES", &mut mm, 1)?;
        c.host.max_message = mm as u64;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_errors() {
        assert_eq!(parse_bytes("64K"), Some(65536));
        assert_eq!(parse_bytes("2m"), Some(2 << 20));
        assert_eq!(parse_bytes("7"), Some(7));
        assert_eq!(parse_bytes("x"), None);
        let c = Config::from_lookup(&|k| (k == "SUCL_TIMEOUT").then(|| "2.5".to_string())).unwrap();
        assert_eq!(c.host.timeout, Duration::from_millis(2500));
        let e = Config::from_lookup(&|k| (k == "SUCL_BACKEND").then(|| "carrier-pigeon".to_string())).unwrap_err().to_string();
        assert!(e.contains("SUCL_BACKEND") && e.contains("carrier-pigeon"), "{e}");
        let e = Config::from_lookup(&|k| (k == "SUCL_SHM_RING_BYTES").then(|| "12".to_string())).unwrap_err().to_string();
        assert!(e.contains("at least 4096"), "{e}");
    }
}
