//! Per-call backend selection: SuCL's threshold generalized to a tuning table.
//!
//! Every rank uses rank 0's [`Policy`] (exchanged at init), restricted to the backends every rank
//! of the communicator can use, so all ranks pick the same backend for the same call even when
//! their configurations differ.

use crate::config::{BackendChoice, Config, Rule};
use serde::{Deserialize, Serialize};
use sucl_core::backend::CollDesc;
use sucl_core::CollOp;

/// The hierarchical choice's name (shm inside hosts, tcp between them; collectives only).
pub const HIER: &str = "hier";

/// The selection rules of a job (rank 0's, exchanged at init).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// A backend every call must use, if forced.
    pub forced: Option<String>,
    /// The universal fallback.
    pub default: String,
    /// The platform's preferred backend.
    pub preferred: String,
    /// Below this many bytes the default backend; 0 always the preferred; negative never.
    pub threshold: i64,
    /// The tuning table; first match wins.
    pub rules: Vec<Rule>,
    /// The `cuda` platform's threshold: calls on device buffers below it are staged, from it on NCCL.
    #[serde(default)]
    pub device_threshold: i64,
}

impl Policy {
    /// The policy `cfg` describes for `platform`.
    pub fn from_config(cfg: &Config, platform: &str) -> Policy {
        let p = cfg.platforms.get(platform).or_else(|| cfg.platforms.get("host")).expect("host platform");
        Policy {
            forced: match &cfg.backend {
                BackendChoice::Auto => None,
                BackendChoice::Named(n) => Some(n.clone()),
            },
            default: cfg.default_backend.clone(),
            preferred: p.preferred.clone(),
            threshold: p.threshold,
            rules: cfg.tuning.clone(),
            device_threshold: cfg.platforms.get("cuda").map_or(0, |p| p.threshold),
        }
    }

    /// The policy of calls on device buffers: the same tuning table (its `nccl`, `ipc` and `staged`
    /// rules), then [`default_ipc_rules`] (when peer memory is set up), then the `cuda`
    /// threshold between staged (below) and NCCL.
    pub fn for_devices(&self) -> Policy {
        self.for_devices_with(true)
    }

    /// [`Policy::for_devices`], with the default peer-memory rules only where `ipc_by_default`:
    /// ranks sharing one GPU leave them out (their kernels time-slice, so a kernel waiting for a
    /// peer's flag waits a whole time slice — about 4.5 ms per call measured on an H100), and
    /// use peer memory only where the tuning table or a pin asks for it.
    pub fn for_devices_with(&self, ipc_by_default: bool) -> Policy {
        let mut rules = self.rules.clone();
        if ipc_by_default {
            rules.extend(default_ipc_rules());
        }
        Policy {
            forced: None,
            default: "staged".into(),
            preferred: "nccl".into(),
            threshold: self.device_threshold,
            rules,
            device_threshold: self.device_threshold,
        }
    }
}

/// Where peer memory serves device collectives when no tuning table says otherwise: the sizes
/// where kernels on peers' buffers beat NCCL on one NVLink node. all_reduce by rank count, as
/// measured side by side with NCCL (`bench/data/gpu-ipc-vs-nccl.csv`, `gpu-ipc-4gpu.csv`):
/// - 2 ranks: below 32 MiB (2 × H200: ipc 0.77× NCCL's time at 8 MiB, 0.86× at 16 MiB, a tie
///   at 32 MiB — 0.98× — and 1.08× at 64 MiB);
/// - 3 and 4 ranks: below 16 MiB (4 × H100: 0.86× at 4 MiB, 0.91× at 8 MiB, a tie at 16 MiB);
/// - 5 to 8 ranks: below 4 MiB (not measured beyond 4 ranks: the bound the kernels were first
///   given, from published measurements of the same design).
///
/// broadcast, all_gather and reduce_scatter below 1 MiB at any rank count. `sucl tune --device
/// cuda` measures the real crossovers of a machine.
pub fn default_ipc_rules() -> Vec<Rule> {
    let rule = |op: &str, ranks: (usize, usize), hi: u64| Rule { op: Some(op.into()), ranks, bytes: (0, hi), backend: "ipc".into() };
    vec![
        rule("all_reduce", (2, 2), 32 << 20),
        rule("all_reduce", (3, 4), 16 << 20),
        rule("all_reduce", (5, 8), 4 << 20),
        rule("broadcast", (2, 8), 1 << 20),
        rule("all_gather", (2, 8), 1 << 20),
        rule("reduce_scatter", (2, 8), 1 << 20),
    ]
}

/// The device backend the built-in rules alone (no tuning table, nothing pinned, the default
/// `cuda` threshold) give a collective `op` of `bytes` bytes on `ranks` ranks whose loaded device
/// backends are `names`: what `sucl tune --device cuda` leans to where its measurements cannot
/// tell backends apart. `None` if `names` lacks the staged fallback every device job loads.
pub fn default_device_choice(names: &[&'static str], ranks: usize, op: CollOp, bytes: u64) -> Option<&'static str> {
    if !names.contains(&"staged") {
        return None;
    }
    let builtin =
        Policy { forced: None, default: "staged".into(), preferred: "nccl".into(), threshold: 0, rules: vec![], device_threshold: 0 };
    let s = Selector::new(&builtin.for_devices(), names, ranks);
    Some(names[s.pick(op, bytes)])
}

/// The size a call is selected by: the largest buffer of one rank, as `sucl bench` counts it.
pub fn selection_bytes(d: &CollDesc, n: usize) -> u64 {
    let per = (d.count * d.dtype.size()) as u64;
    match d.op {
        CollOp::AllGather | CollOp::Gather | CollOp::Scatter | CollOp::AllToAll | CollOp::ReduceScatter => per * n as u64,
        _ => per,
    }
}

struct IndexedRule {
    op: Option<CollOp>,
    ranks: (usize, usize),
    bytes: (u64, u64),
    backend: usize,
}

/// A policy resolved against the backends one communicator loaded.
pub(crate) struct Selector {
    names: Vec<&'static str>,
    forced: Option<usize>,
    default: usize,
    preferred: usize,
    threshold: i64,
    rules: Vec<IndexedRule>,
    size: usize,
    /// The hierarchical choice, if loaded: it serves collectives only.
    hier: Option<usize>,
}

impl Selector {
    /// Resolves `policy` for a communicator of `size` ranks that loaded `names` (which must
    /// include the default backend).
    pub fn new(policy: &Policy, names: &[&'static str], size: usize) -> Selector {
        let idx = |n: &str| names.iter().position(|&x| x == n);
        let default = idx(&policy.default).expect("the default backend is always loaded");
        let rules = policy
            .rules
            .iter()
            .filter_map(|r| {
                Some(IndexedRule { op: r.op.as_deref().and_then(CollOp::parse), ranks: r.ranks, bytes: r.bytes, backend: idx(&r.backend)? })
            })
            .collect();
        let hier = idx(HIER);
        Selector {
            names: names.to_vec(),
            forced: policy.forced.as_deref().and_then(idx),
            default,
            // A preferred backend that cannot serve these ranks (shm across hosts) gives way to
            // the hierarchical one where the ranks form a grid of hosts.
            preferred: idx(&policy.preferred).or(hier).unwrap_or(default),
            threshold: policy.threshold,
            rules,
            size,
            hier,
        }
    }

    /// The backend index for a collective `op` of `bytes` bytes.
    #[inline]
    pub fn pick(&self, op: CollOp, bytes: u64) -> usize {
        if let Some(f) = self.forced {
            return f;
        }
        for r in &self.rules {
            if r.op.is_none_or(|o| o == op) && r.ranks.0 <= self.size && self.size <= r.ranks.1 && r.bytes.0 <= bytes && bytes < r.bytes.1 {
                return r.backend;
            }
        }
        if self.threshold < 0 || (bytes as i128) < self.threshold as i128 {
            self.default
        } else {
            self.preferred
        }
    }

    /// The backend of point-to-point calls (fixed, since sender and receiver sizes may differ) while `pinned` (if any) is pinned: the pinned or
    /// forced one, else the preferred one, except that a collectives-only choice (`hier`) hands
    /// point-to-point to the default backend.
    pub fn p2p_with(&self, pinned: Option<usize>) -> usize {
        let i = pinned.or(self.forced).unwrap_or(self.preferred);
        if Some(i) == self.hier {
            self.default
        } else {
            i
        }
    }

    /// The universal fallback.
    pub fn default(&self) -> usize {
        self.default
    }

    /// Loaded backend names, by index.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }

    /// `auto` when calls may go to different backends, else the one backend's name.
    pub fn label(&self) -> &'static str {
        match self.forced {
            Some(f) => self.names[f],
            None if self.names.len() == 1 => self.names[0],
            None => "auto",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(threshold: i64, rules: Vec<Rule>) -> Policy {
        Policy { forced: None, default: "tcp".into(), preferred: "shm".into(), threshold, rules, device_threshold: 0 }
    }

    #[test]
    fn threshold_semantics() {
        let names = ["shm", "tcp"];
        let s = Selector::new(&policy(65536, vec![]), &names, 2);
        assert_eq!(names[s.pick(CollOp::AllReduce, 100)], "tcp");
        assert_eq!(names[s.pick(CollOp::AllReduce, 65536)], "shm");
        let s = Selector::new(&policy(0, vec![]), &names, 2);
        assert_eq!(names[s.pick(CollOp::AllReduce, 0)], "shm");
        let s = Selector::new(&policy(-1, vec![]), &names, 2);
        assert_eq!(names[s.pick(CollOp::AllReduce, 1 << 30)], "tcp");
    }

    #[test]
    fn rules_first_match_by_op_ranks_and_size() {
        let names = ["shm", "tcp"];
        let rules = vec![
            Rule { op: Some("all_reduce".into()), ranks: (2, 2), bytes: (0, 1024), backend: "tcp".into() },
            Rule { op: None, ranks: (3, 8), bytes: (0, u64::MAX), backend: "tcp".into() },
            Rule { op: Some("broadcast".into()), ranks: (1, 8), bytes: (0, 10), backend: "mpi".into() },
        ];
        let s2 = Selector::new(&policy(0, rules.clone()), &names, 2);
        assert_eq!(names[s2.pick(CollOp::AllReduce, 1023)], "tcp");
        assert_eq!(names[s2.pick(CollOp::AllReduce, 1024)], "shm");
        assert_eq!(names[s2.pick(CollOp::Broadcast, 5)], "shm", "rules naming unloaded backends are skipped");
        let s4 = Selector::new(&policy(0, rules), &names, 4);
        assert_eq!(names[s4.pick(CollOp::Gather, 5)], "tcp");
        assert_eq!(s4.label(), "auto");
    }

    #[test]
    fn hier_takes_over_from_an_unusable_preferred_backend_but_never_point_to_point() {
        // Ranks on several hosts: shm is not loaded, so the preferred choice falls to hier.
        let names = ["tcp", "hier"];
        let s = Selector::new(&policy(0, vec![]), &names, 4);
        assert_eq!(names[s.pick(CollOp::AllReduce, 1 << 20)], "hier");
        assert_eq!(names[s.pick(CollOp::Broadcast, 8)], "hier");
        assert_eq!(names[s.p2p_with(None)], "tcp", "hier carries no point-to-point");
        assert_eq!(names[s.p2p_with(Some(1))], "tcp", "not even when pinned");
        assert_eq!(names[s.p2p_with(Some(0))], "tcp");
        // Below the threshold the default; a rule may still name either.
        let rules = vec![Rule { op: Some("all_reduce".into()), ranks: (4, 4), bytes: (0, 1024), backend: "tcp".into() }];
        let s = Selector::new(&policy(64, rules), &names, 4);
        assert_eq!(names[s.pick(CollOp::AllReduce, 100)], "tcp");
        assert_eq!(names[s.pick(CollOp::AllGather, 10)], "tcp", "below the threshold");
        assert_eq!(names[s.pick(CollOp::AllGather, 64)], "hier");
        // One host: shm stays preferred even if hier were loaded.
        let names = ["shm", "tcp", "hier"];
        let s = Selector::new(&policy(0, vec![]), &names, 4);
        assert_eq!(names[s.pick(CollOp::AllReduce, 1 << 20)], "shm");
    }

    #[test]
    fn device_calls_follow_the_nccl_and_staged_rules_then_the_cuda_threshold() {
        let rules = vec![
            Rule { op: Some("all_reduce".into()), ranks: (2, 2), bytes: (0, 4096), backend: "staged".into() },
            Rule { op: None, ranks: (1, 64), bytes: (0, u64::MAX), backend: "shm".into() },
        ];
        let mut host = policy(0, rules);
        host.device_threshold = 1 << 20;
        let dev = host.for_devices();
        let both = ["nccl", "staged"];
        let s = Selector::new(&dev, &both, 2);
        assert_eq!(both[s.pick(CollOp::AllReduce, 100)], "staged", "rule");
        // Host rules do not apply to calls on device buffers; the cuda threshold does.
        assert_eq!(both[s.pick(CollOp::Broadcast, 100)], "staged", "below the threshold");
        assert_eq!(both[s.pick(CollOp::Broadcast, 1 << 20)], "nccl", "from the threshold on");
        // Without NCCL on every rank, everything is staged.
        let only = ["staged"];
        let s = Selector::new(&dev, &only, 2);
        assert_eq!(only[s.pick(CollOp::AllGather, 1 << 30)], "staged");
    }

    #[test]
    fn peer_memory_serves_small_device_collectives_unless_the_table_says_otherwise() {
        let names = ["nccl", "ipc", "staged"];
        let s = Selector::new(&policy(0, vec![]).for_devices(), &names, 2);
        assert_eq!(names[s.pick(CollOp::AllReduce, 8)], "ipc");
        assert_eq!(names[s.pick(CollOp::AllReduce, (32 << 20) - 1)], "ipc");
        assert_eq!(names[s.pick(CollOp::AllReduce, 32 << 20)], "nccl", "large all_reduce stays on NCCL by default");
        assert_eq!(names[s.pick(CollOp::AllGather, 1 << 20)], "nccl");
        assert_eq!(names[s.pick(CollOp::AllToAll, 8)], "nccl", "no peer-memory all_to_all");
        let one = Selector::new(&policy(0, vec![]).for_devices(), &names, 1);
        assert_eq!(names[one.pick(CollOp::AllReduce, 8)], "nccl", "one rank: nothing to gain");
        // A tuning rule comes first.
        let tuned = vec![Rule { op: Some("all_reduce".into()), ranks: (2, 2), bytes: (0, 1 << 10), backend: "nccl".into() }];
        let s = Selector::new(&policy(0, tuned).for_devices(), &names, 2);
        assert_eq!(names[s.pick(CollOp::AllReduce, 100)], "nccl");
        assert_eq!(names[s.pick(CollOp::AllReduce, 2 << 10)], "ipc");
        // Without peer memory set up, its rules are skipped.
        let two = ["nccl", "staged"];
        let s = Selector::new(&policy(0, vec![]).for_devices(), &two, 2);
        assert_eq!(two[s.pick(CollOp::AllReduce, 8)], "nccl");
    }

    #[test]
    fn the_default_all_reduce_bound_follows_the_rank_count() {
        let names = ["nccl", "ipc", "staged"];
        // (ranks, the first size NCCL serves): where the measurements put the crossover.
        for (ranks, nccl_from) in [(2, 32u64 << 20), (3, 16 << 20), (4, 16 << 20), (5, 4 << 20), (8, 4 << 20)] {
            let s = Selector::new(&policy(0, vec![]).for_devices(), &names, ranks);
            for bytes in [8, nccl_from / 2, nccl_from - 1] {
                assert_eq!(names[s.pick(CollOp::AllReduce, bytes)], "ipc", "{ranks} ranks, {bytes} B");
            }
            for bytes in [nccl_from, 64 << 20] {
                assert_eq!(names[s.pick(CollOp::AllReduce, bytes)], "nccl", "{ranks} ranks, {bytes} B");
            }
            // The other collectives keep their 1 MiB bound at every rank count.
            assert_eq!(names[s.pick(CollOp::Broadcast, (1 << 20) - 1)], "ipc", "{ranks} ranks");
            assert_eq!(names[s.pick(CollOp::Broadcast, 1 << 20)], "nccl", "{ranks} ranks");
        }
        let nine = Selector::new(&policy(0, vec![]).for_devices(), &names, 9);
        assert_eq!(names[nine.pick(CollOp::AllReduce, 8)], "nccl", "beyond 8 ranks: not measured, NCCL");
    }

    #[test]
    fn the_built_in_device_choice_ignores_tuning_tables() {
        let names = ["nccl", "ipc", "staged"];
        assert_eq!(default_device_choice(&names, 4, CollOp::AllReduce, 8 << 20), Some("ipc"));
        assert_eq!(default_device_choice(&names, 4, CollOp::AllReduce, 16 << 20), Some("nccl"));
        assert_eq!(default_device_choice(&names, 4, CollOp::Broadcast, 1 << 20), Some("nccl"));
        assert_eq!(default_device_choice(&["nccl", "staged"], 4, CollOp::AllReduce, 8), Some("nccl"));
        assert_eq!(default_device_choice(&["nccl"], 4, CollOp::AllReduce, 8), None);
    }

    #[test]
    fn ranks_sharing_a_gpu_use_peer_memory_only_when_asked() {
        let names = ["ipc", "staged"];
        let s = Selector::new(&policy(0, vec![]).for_devices_with(false), &names, 2);
        for bytes in [8, 4 << 10, 1 << 20] {
            assert_eq!(names[s.pick(CollOp::AllReduce, bytes)], "staged", "{bytes} B");
        }
        let asked = vec![Rule { op: None, ranks: (1, usize::MAX), bytes: (0, u64::MAX), backend: "ipc".into() }];
        let s = Selector::new(&policy(0, asked).for_devices_with(false), &names, 2);
        assert_eq!(names[s.pick(CollOp::AllReduce, 8)], "ipc", "a tuning rule (SUCL_IPC=force) still picks it");
    }
}
