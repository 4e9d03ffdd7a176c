//! The shim's settings, read from the environment once, before the first call into the real
//! NCCL (NCCL `setenv`s values from its configuration files, racing any later `getenv`).

use std::sync::OnceLock;
use std::time::Duration;

/// The shim's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `SUCL_NCCL_REAL_PATH`: the real libnccl.so.2, an absolute path.
    pub real_path: Option<String>,
    /// `SUCL_NCCL_SERVE` (default 1): 0 forwards every call.
    pub serve: bool,
    /// `SUCL_NCCL_MAX_BYTES` (default [`DEFAULT_MAX_BYTES`]): the largest all_reduce served.
    pub max_bytes: usize,
    /// `SUCL_NCCL_TIMEOUT_S` (default 300): bounds every wait of the shim's setup and kernels.
    pub timeout: Duration,
    /// `SUCL_NCCL_DEBUG` (default 0): 1 prints each communicator's setup outcome on stderr.
    pub debug: bool,
    /// `NCCL_COMM_BLOCKING`, which overrides every communicator's configured blocking mode.
    pub nccl_comm_blocking: Option<bool>,
    /// A setting that could not be read, reported at the first call that needs it.
    pub error: Option<String>,
}

/// The largest all_reduce served by default, in bytes.
pub const DEFAULT_MAX_BYTES: usize = 256 << 10;

impl Settings {
    /// Reads the settings through `get`.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Settings {
        let mut error = None;
        let mut num = |k: &str, d: u64| -> u64 {
            match get(k) {
                None => d,
                Some(v) => v.trim().parse().unwrap_or_else(|_| {
                    error.get_or_insert(format!("{k}={v:?}: want a whole number"));
                    d
                }),
            }
        };
        let serve = num("SUCL_NCCL_SERVE", 1) != 0;
        let max_bytes = num("SUCL_NCCL_MAX_BYTES", DEFAULT_MAX_BYTES as u64) as usize;
        let timeout = Duration::from_secs(num("SUCL_NCCL_TIMEOUT_S", 300).max(1));
        let debug = num("SUCL_NCCL_DEBUG", 0) != 0;
        let real_path = get("SUCL_NCCL_REAL_PATH").filter(|p| !p.is_empty());
        if let Some(p) = &real_path {
            if !p.starts_with('/') {
                error.get_or_insert(format!("SUCL_NCCL_REAL_PATH={p:?}: want an absolute path"));
            }
        }
        let nccl_comm_blocking = get("NCCL_COMM_BLOCKING").and_then(|v| v.trim().parse::<i64>().ok()).map(|v| v != 0);
        Settings { real_path, serve, max_bytes, timeout, debug, nccl_comm_blocking, error }
    }
}

/// The process's settings (read at the first call).
pub fn get() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::from_lookup(&|k| std::env::var(k).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Settings {
        Settings::from_lookup(&|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn settings_have_defaults_and_bad_values_are_reported() {
        let d = with(&[]);
        assert!(d.serve && d.real_path.is_none() && d.error.is_none());
        assert_eq!((d.max_bytes, d.timeout), (DEFAULT_MAX_BYTES, Duration::from_secs(300)));
        let s = with(&[("SUCL_NCCL_SERVE", "0"), ("SUCL_NCCL_MAX_BYTES", "4096"), ("SUCL_NCCL_REAL_PATH", "/x/libnccl.so.2")]);
        assert!(!s.serve && s.max_bytes == 4096 && s.real_path.as_deref() == Some("/x/libnccl.so.2"));
        assert!(with(&[("SUCL_NCCL_MAX_BYTES", "lots")]).error.unwrap().contains("SUCL_NCCL_MAX_BYTES"));
        assert!(with(&[("SUCL_NCCL_REAL_PATH", "libnccl.so.2")]).error.unwrap().contains("absolute"));
    }
}
