//! Finding this process's place in the job from the launcher's environment.
//!
//! sucl's own launcher (`SUCL_*`), torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`), Open MPI (`OMPI_COMM_WORLD_*`), Slurm (`SLURM_PROCID`, ...) and PMI
//! (`PMI_RANK`, `PMI_SIZE`) are recognized, in that order. No launcher means a world of one.

use crate::error::{Error, Result};

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
        (Some(format!("{host}:{port}")), true)
    } else if size == 1 {
        (None, false)
    } else if launcher == Launcher::Torchrun {
        return Err(Error::Config("RANK/WORLD_SIZE are set but MASTER_ADDR is not".into()));
    } else {
        // One host assumed; set MASTER_ADDR (and MASTER_PORT) for jobs across hosts.
        (Some(format!("127.0.0.1:{}", default_port(&job_id))), true)
    };
    Ok(LaunchEnv { launcher, rank, size, local_rank, store_addr, rank0_hosts_store, job_id })
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
    fn bad_environment_is_a_clear_error() {
        let err = detect(&env(&[("RANK", "4"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "h")])).unwrap_err().to_string();
        assert!(err.contains("RANK=4 is out of range"), "{err}");
        let err = detect(&env(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err().to_string();
        assert!(err.contains("RANK=\"x\""), "{err}");
        let err = detect(&env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err().to_string();
        assert!(err.contains("MASTER_ADDR"), "{err}");
    }
}
