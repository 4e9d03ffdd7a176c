//! The peer-memory ("ipc") device backend: collectives among ranks of one machine whose GPUs
//! can read and write each other's memory (NVLink or PCIe peer access), done by kernels that
//! read the peers' buffers directly instead of going through NCCL's protocol machinery.
//!
//! Setup (collective, [`IpcBackend::setup`]): every rank allocates one peer buffer — a signal
//! area of per-block flags and epochs, then a data area — with `cuMemAlloc`, exports it with
//! `cuIpcGetMemHandle`, and publishes a [`record::PeerRecord`] through the exchange the caller
//! provides (the communicator's rendezvous store). Every rank validates every record, checks
//! `cuDeviceCanAccessPeer` towards each peer's GPU and opens each peer's buffer
//! (`cuIpcOpenMemHandle`); a second exchange makes every rank agree on the outcome, so either all
//! ranks use the backend or none does, with the reason. No multicast object is ever created.
//!
//! Calls ([`DeviceBackend::collective`]) enqueue one kernel per piece of at most half the data
//! area on the caller's stream and return: no host synchronization and no allocation, so they
//! can be captured into CUDA graphs (the epochs and the parity live in device memory). Launches
//! alternate between the data area's halves, so that no kernel waits for its peers at its end. Kernels never wait
//! unboundedly: a spin that outlasts the timeout, or sees the host's abort word, writes a status
//! word in host-mapped memory and returns; [`DeviceBackend::synchronize`] reads it and fails —
//! raising the job's abort flag so that every other rank fails too.

pub mod kernels;
pub mod plan;
pub mod record;

use crate::{cuda_err, Device, DeviceBackend};
use cudarc::driver::sys as cu;
use cudarc::driver::{CudaFunction, CudaModule, CudaStream};
use kernels::{ModuleKey, Shape};
use plan::{Kind, MAX_RANKS, SIGNAL_BYTES, THREADS};
use record::{KernelSettings, PeerRecord, HANDLE_LEN};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use sucl_core::backend::{CollDesc, CollOp};
use sucl_core::wait::{Backoff, Waiter};
use sucl_core::{AbortState, DType, Error, ReduceOp, Result};

/// Default bytes of each rank's data area (`SUCL_IPC_BUFFER_BYTES`); calls larger than half of it
/// run in pieces.
pub const DEFAULT_BUFFER_BYTES: usize = 32 << 20;
/// Smallest data area: one slot per row of the largest reduce_scatter ([`MAX_RANKS`] rows).
pub const MIN_BUFFER_BYTES: usize = 4096;
/// Default size from which all_reduce runs two-shot (`SUCL_IPC_TWO_SHOT_BYTES`) on `n` ranks:
/// 4 MiB / n. One-shot reads (n − 1) times the call from peers, two-shot 2(n − 1)/n times, so
/// the crossover falls as n grows. On 2 × H200 (2026-11-23) one-shot took 9.8–10.2 µs at 1 MiB
/// against two-shot's 11–13, both 15.6–16.6 at 2 MiB; on 4 × H100 (2026-11-27) one-shot
/// 12.8–13.6 µs at 512 KiB against two-shot's 14.2–14.9, and 19.6–21.3 at 1 MiB against
/// 16.9–17.3 (`scripts/ipc-sweep.sh`; docs/results.md, "CUDA device buffers").
pub fn default_two_shot_bytes(n: usize) -> usize {
    (4 << 20) / n.clamp(2, MAX_RANKS)
}
/// Default grid cap (`SUCL_IPC_BLOCKS`; the grid is also at most the GPUs' multiprocessors and
/// [`plan::MAX_BLOCKS`]). 128 was best from 512 KiB up on 2 GPUs, level below; on 4 GPUs 32, 64
/// and 128 were within 3 % of each other at every size.
pub const DEFAULT_BLOCKS: usize = 128;
/// Default slots per thread per loop iteration (`SUCL_IPC_UNROLL`, one of [`plan::UNROLLS`]) on
/// `n` ranks: 4 on 2 ranks; 2 from 4 ranks on, where the reducing loops load n vectors per slot
/// (on 4 × H100 unroll 2 was as fast as 4 and 8 for two-shot and 0.1–0.9 µs faster for
/// one-shot from 8 B to 1 MiB).
pub fn default_unroll(n: usize) -> usize {
    if n >= 4 {
        2
    } else {
        4
    }
}
/// Default of `SUCL_IPC_PUSH`: one-shot all_reduce pushes (writes) each rank's input into its
/// peers' data areas rather than each rank pulling (reading) the peers'. On 4 × H100
/// (2026-11-27) pushing took 5.9–6.4 µs from 8 B to 4 KiB against pulling's 6.6–6.8, and
/// 5.2–5.3 against 6.1–6.2 to 2 KiB captured in a CUDA graph; from 8 KiB to 512 KiB 0.1–1.3 µs
/// less (not captured). A
/// pushing two-shot was measured too and was 1.5–5 % slower than pulling from 2 MiB up, so
/// two-shot pulls.
pub const DEFAULT_PUSH: bool = true;

/// Settings of a peer-memory communicator.
#[derive(Clone, Copy, Debug)]
pub struct IpcOptions {
    /// Whether this rank may use the backend (its configuration lists `ipc`).
    pub allowed: bool,
    /// Bytes of each rank's data area (every rank must use the same).
    pub buffer_bytes: usize,
    /// all_reduce runs two-shot from this many bytes on (every rank must use the same); `None`:
    /// [`default_two_shot_bytes`] of the communicator's ranks.
    pub two_shot_bytes: Option<usize>,
    /// Most blocks a kernel launches, 1 to [`plan::MAX_BLOCKS`] (every rank must use the same).
    pub blocks: usize,
    /// Slots each thread moves per loop iteration, one of [`plan::UNROLLS`] (every rank must use
    /// the same); `None`: [`default_unroll`] of the communicator's ranks.
    pub unroll: Option<usize>,
    /// Whether the kernels also meet at an end barrier (every rank must use the same).
    pub end_barrier: bool,
    /// Whether one-shot all_reduce pushes its input into the peers' data areas (remote writes)
    /// rather than reading theirs (every rank must use the same).
    pub push: bool,
}

impl IpcOptions {
    /// Defaults, overridden by `SUCL_IPC_BUFFER_BYTES` and `SUCL_IPC_TWO_SHOT_BYTES` (plain
    /// byte counts), `SUCL_IPC_BLOCKS`, `SUCL_IPC_UNROLL`, `SUCL_IPC_END_BARRIER` and
    /// `SUCL_IPC_PUSH` (0 or 1); `allowed` as given.
    pub fn from_env(allowed: bool) -> std::result::Result<IpcOptions, String> {
        Self::from_lookup(allowed, &|k| std::env::var(k).ok())
    }

    /// As [`IpcOptions::from_env`], reading variables through `get`.
    pub fn from_lookup(allowed: bool, lookup: &dyn Fn(&str) -> Option<String>) -> std::result::Result<IpcOptions, String> {
        let number = |k: &str, min: usize| -> std::result::Result<Option<usize>, String> {
            match lookup(k) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= min)
                    .map(Some)
                    .ok_or_else(|| format!("{k}={v:?}: want a whole number of at least {min}")),
            }
        };
        let flag = |k: &str, d: bool| -> std::result::Result<bool, String> {
            match number(k, 0)? {
                None => Ok(d),
                Some(0) => Ok(false),
                Some(1) => Ok(true),
                Some(n) => Err(format!("{k}={n}: want 0 or 1")),
            }
        };
        Ok(IpcOptions {
            allowed,
            buffer_bytes: number("SUCL_IPC_BUFFER_BYTES", MIN_BUFFER_BYTES)?.unwrap_or(DEFAULT_BUFFER_BYTES).next_multiple_of(plan::SLOT),
            two_shot_bytes: number("SUCL_IPC_TWO_SHOT_BYTES", 0)?,
            blocks: Some(number("SUCL_IPC_BLOCKS", 1)?.unwrap_or(DEFAULT_BLOCKS)).filter(|&b| b <= plan::MAX_BLOCKS).ok_or_else(|| {
                format!("SUCL_IPC_BLOCKS={:?}: want 1 to {}", lookup("SUCL_IPC_BLOCKS").unwrap_or_default(), plan::MAX_BLOCKS)
            })?,
            unroll: match number("SUCL_IPC_UNROLL", 1)? {
                Some(u) if !plan::UNROLLS.contains(&u) => {
                    return Err(format!(
                        "SUCL_IPC_UNROLL={:?}: want one of {:?}",
                        lookup("SUCL_IPC_UNROLL").unwrap_or_default(),
                        plan::UNROLLS
                    ))
                }
                u => u,
            },
            end_barrier: flag("SUCL_IPC_END_BARRIER", false)?,
            push: flag("SUCL_IPC_PUSH", DEFAULT_PUSH)?,
        })
    }

    /// The two-shot threshold on `n` ranks: the setting, else [`default_two_shot_bytes`].
    pub fn two_shot_bytes_for(&self, n: usize) -> usize {
        self.two_shot_bytes.unwrap_or_else(|| default_two_shot_bytes(n))
    }

    /// The unroll on `n` ranks: the setting, else [`default_unroll`].
    pub fn unroll_for(&self, n: usize) -> usize {
        self.unroll.unwrap_or_else(|| default_unroll(n))
    }

    /// The settings every rank of `n` must share, as published in the setup records.
    fn kernel_settings(&self, n: usize) -> KernelSettings {
        KernelSettings {
            two_shot_bytes: self.two_shot_bytes_for(n) as u64,
            blocks: self.blocks as u32,
            unroll: self.unroll_for(n) as u32,
            end_barrier: self.end_barrier,
            push: self.push,
        }
    }
}

/// The kernels' argument block (`struct Args` in kernels.cu, field for field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Args {
    peers: [u64; MAX_RANKS],
    status: u64,
    abort_word: u64,
    input: u64,
    output: u64,
    count: i64,
    in_pitch: i64,
    out_pitch: i64,
    chunk: i64,
    timeout_ns: i64,
    rank: i32,
    nranks: i32,
    root: i32,
    reserved: i32,
    half: i64,
}

/// Exchanges `bytes` with every rank of the communicator under `key` (unique per call) and
/// returns every rank's bytes in rank order: the rendezvous store's all-gather.
pub type Exchange<'a> = &'a mut dyn FnMut(&str, &[u8]) -> Result<Vec<Vec<u8>>>;

/// Whether the GPUs this process sees can reach each other's memory: for `sucl info`. Ok with a
/// summary, or the first pair that cannot and why.
pub fn peer_access_report() -> std::result::Result<String, String> {
    let n = crate::probe()?;
    // SAFETY: cuInit was done by probe (device_count initializes the driver); each call writes
    // one int through a pointer to a live local.
    unsafe {
        for i in 0..n {
            for j in 0..n {
                if i == j {
                    continue;
                }
                let (mut di, mut dj, mut can) = (0, 0, 0);
                let rc = cu::cuDeviceGet(&mut di, i as i32);
                let rc2 = cu::cuDeviceGet(&mut dj, j as i32);
                if rc != cu::CUresult::CUDA_SUCCESS || rc2 != cu::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuDeviceGet: {rc:?} / {rc2:?}"));
                }
                let rc = cu::cuDeviceCanAccessPeer(&mut can, di, dj);
                if rc != cu::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuDeviceCanAccessPeer(cuda:{i}, cuda:{j}): {rc:?}"));
                }
                if can == 0 {
                    return Err(format!("cuda:{i} cannot access the memory of cuda:{j} (cuDeviceCanAccessPeer = 0)"));
                }
            }
        }
    }
    Ok(if n == 1 {
        "one GPU: ranks sharing it use peer memory only when pinned (their kernels time-slice)".into()
    } else {
        format!("peer access between all {n} GPUs")
    })
}

fn rc_ok(rc: cu::CUresult, what: &str) -> std::result::Result<(), String> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {rc:?}"))
    }
}

/// A peer-memory communicator's device side: this rank's peer buffer, every peer's mapped, the
/// host-mapped status and abort words, and the compiled kernels.
pub struct IpcBackend {
    dev: Device,
    rank: usize,
    size: usize,
    world_ranks: Vec<usize>,
    abort: Arc<AbortState>,
    timeout: Duration,
    backoff: Backoff,
    opts: IpcOptions,
    /// This rank's peer buffer (`cuMemAlloc`), 0 until allocated.
    own: u64,
    /// Peers' buffers opened here (`cuIpcOpenMemHandle`), closed on drop.
    opened: Vec<u64>,
    /// Every rank's buffer as this process addresses it.
    peers: [u64; MAX_RANKS],
    /// Host-mapped words: [0] status (kernels write), [1] abort (host writes). Null until made.
    words: *mut u32,
    words_dev: u64,
    arch: &'static str,
    modules: HashMap<ModuleKey, Arc<CudaModule>>,
    functions: HashMap<(Kind, DType, ReduceOp), CudaFunction>,
    /// Set once a call failed: the peers' epochs no longer match ours.
    broken: Option<String>,
    /// Multiprocessors of this rank's GPU (published in the record).
    sms: u32,
    /// Most blocks a launch uses: the same on every rank (plan::grid_cap of shared values).
    grid_cap: usize,
}

// SAFETY: the raw pointer is this backend's own pinned allocation, used only through `&self`
// (volatile reads) or `&mut self`; CUDA driver handles may be used from any thread.
unsafe impl Send for IpcBackend {}

impl Drop for IpcBackend {
    fn drop(&mut self) {
        if self.dev.context().bind_to_thread().is_err() {
            return;
        }
        if !self.words.is_null() && (self.broken.is_some() || self.abort.is_set()) {
            // Kernels still spinning on a lost peer give up now.
            self.set_abort_word();
        }
        // SAFETY: the context is current; synchronizing waits for this rank's kernels, which
        // are bounded by the timeout and end at once once the abort word is set. Then nothing
        // reads the buffers: each peer mapping is closed once, our buffer and the host words
        // freed once (their fields are reset so that nothing uses them again).
        unsafe {
            let _ = cu::cuCtxSynchronize();
            for p in self.opened.drain(..) {
                let _ = cu::cuIpcCloseMemHandle(p);
            }
            if self.own != 0 {
                let _ = cu::cuMemFree_v2(self.own);
                self.own = 0;
            }
            if !self.words.is_null() {
                let _ = cu::cuMemFreeHost(self.words as *mut std::ffi::c_void);
                self.words = std::ptr::null_mut();
            }
        }
    }
}

impl IpcBackend {
    /// Sets up peer memory for rank `rank` of `size` (world ranks `world_ranks`) on `dev`.
    /// Collective: every rank calls it with the same `exchange`. `Ok(Ok(backend))` when every
    /// rank can use it; `Ok(Err(why))` on every rank when one cannot (why names that rank);
    /// `Err` when the exchange itself failed (a lost rank, the timeout).
    #[allow(clippy::too_many_arguments)]
    pub fn setup(
        dev: &Device,
        rank: usize,
        size: usize,
        world_ranks: Vec<usize>,
        abort: Arc<AbortState>,
        timeout: Duration,
        backoff: Backoff,
        opts: IpcOptions,
        exchange: Exchange<'_>,
    ) -> Result<std::result::Result<IpcBackend, String>> {
        let mut me = IpcBackend {
            dev: dev.clone(),
            rank,
            size,
            world_ranks,
            abort,
            timeout,
            backoff,
            opts,
            own: 0,
            opened: vec![],
            peers: [0; MAX_RANKS],
            words: std::ptr::null_mut(),
            words_dev: 0,
            arch: "compute_70",
            modules: HashMap::new(),
            functions: HashMap::new(),
            broken: None,
            sms: 0,
            grid_cap: 1,
        };
        let node = record::this_node();
        let prepared = if opts.allowed {
            me.prepare(node)
        } else {
            Err("disabled by the configuration (platforms.cuda.backends or SUCL_IPC=0)".into())
        };
        let rec = match &prepared {
            Ok(r) => r.clone(),
            Err(_) => PeerRecord {
                ready: false,
                rank: rank as u32,
                size: size as u32,
                node,
                bus_id: String::new(),
                capacity: 0,
                handle: [0; HANDLE_LEN],
                settings: opts.kernel_settings(size),
                sms: 0,
            },
        };
        let all = exchange("ipc/records", &rec.encode())?;
        // Every rank reads the same records, so every rank fails alike (before any kernel runs).
        if let Some(what) = record::settings_mismatch(&all) {
            return Err(Error::Mismatch { rank: me.world_rank(), what });
        }
        let mine = prepared.and_then(|_| me.open_peers(&all, node));
        let verdict = match &mine {
            Ok(()) => vec![1u8],
            Err(why) => {
                let mut v = vec![0u8];
                v.extend(why.bytes().take(400));
                v
            }
        };
        let verdicts = exchange("ipc/verdicts", &verdict)?;
        for (r, v) in verdicts.iter().enumerate() {
            if v.first() != Some(&1) {
                let why = String::from_utf8_lossy(v.get(1..).unwrap_or_default()).into_owned();
                return Ok(Err(format!("rank {r}: {}", if why.is_empty() { "no answer".into() } else { why })));
            }
        }
        Ok(Ok(me))
    }

    /// This rank's side: checks the device, allocates and zeroes the peer buffer, makes the
    /// host-mapped words, exports the handle. The record to publish, or why not.
    fn prepare(&mut self, node: u64) -> std::result::Result<PeerRecord, String> {
        let ctx = self.dev.context().clone();
        ctx.bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
        if self.size > MAX_RANKS {
            return Err(format!("{} ranks (the kernels serve at most {MAX_RANKS})", self.size));
        }
        let attr = |a| ctx.attribute(a).map_err(|e| format!("device attribute {a:?}: {e:?}"));
        let major = attr(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        self.arch = kernels::arch(major, minor)?;
        if !kernels::nvrtc_present() {
            return Err("NVRTC (libnvrtc.so) was not found: the kernels cannot be compiled".into());
        }
        let sms = attr(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        self.sms = u32::try_from(sms).ok().filter(|&s| s > 0).ok_or_else(|| format!("the GPU reports {sms} multiprocessors"))?;
        let bytes = SIGNAL_BYTES + self.opts.buffer_bytes;
        let mut bus = [0 as std::ffi::c_char; record::BUS_ID_LEN];
        let mut handle = cu::CUipcMemHandle { reserved: [0; HANDLE_LEN] };
        // SAFETY: the context is current. Every out-pointer is a live local or field; `own` is
        // set only on success and freed once in Drop; the memset covers the signal area inside
        // the allocation; the host words are 8 bytes, allocated mapped, zeroed before their
        // device address is taken, freed once in Drop.
        unsafe {
            rc_ok(cu::cuMemAlloc_v2(&mut self.own, bytes), &format!("cuMemAlloc of {bytes} bytes"))?;
            rc_ok(cu::cuMemsetD8_v2(self.own, 0, SIGNAL_BYTES), "zeroing the signal area")?;
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            let flags = cu::CU_MEMHOSTALLOC_DEVICEMAP | cu::CU_MEMHOSTALLOC_PORTABLE;
            rc_ok(cu::cuMemHostAlloc(&mut p, 8, flags), "cuMemHostAlloc (status words)")?;
            self.words = p as *mut u32;
            std::ptr::write_volatile(self.words, 0);
            std::ptr::write_volatile(self.words.add(1), 0);
            rc_ok(cu::cuMemHostGetDevicePointer_v2(&mut self.words_dev, p, 0), "cuMemHostGetDevicePointer")?;
            rc_ok(cu::cuIpcGetMemHandle(&mut handle, self.own), "cuIpcGetMemHandle")?;
            rc_ok(cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, ctx.cu_device()), "cuDeviceGetPCIBusId")?;
            rc_ok(cu::cuCtxSynchronize(), "zeroing the signal area")?;
        }
        let bus_id: String = bus.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect();
        self.peers[self.rank] = self.own;
        Ok(PeerRecord {
            ready: true,
            rank: self.rank as u32,
            size: self.size as u32,
            node,
            bus_id,
            capacity: self.opts.buffer_bytes as u64,
            handle: handle.reserved.map(|c| c as u8),
            settings: self.opts.kernel_settings(self.size),
            sms: self.sms,
        })
    }

    /// Validates every rank's record, checks peer access to its GPU and opens its buffer.
    fn open_peers(&mut self, all: &[Vec<u8>], node: u64) -> std::result::Result<(), String> {
        if all.len() != self.size {
            return Err(format!("{} records for {} ranks", all.len(), self.size));
        }
        let recs = all
            .iter()
            .enumerate()
            .map(|(j, b)| PeerRecord::decode(b, j, self.size, node, self.opts.buffer_bytes as u64))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if let Some(r) = recs.iter().find(|r| !r.ready) {
            return Err(format!("rank {} could not set up its peer buffer", r.rank));
        }
        // Every block of a launch must be resident at once on every rank's GPU.
        let min_sms = recs.iter().map(|r| r.sms as usize).min().unwrap_or(1);
        self.grid_cap = plan::grid_cap(self.opts.blocks, min_sms);
        let mine = self.dev.context().cu_device();
        for (j, rec) in recs.iter().enumerate() {
            if j == self.rank {
                continue;
            }
            let id = std::ffi::CString::new(rec.bus_id.as_str()).map_err(|_| "bus id".to_string())?;
            let (mut dj, mut can) = (0, 0);
            let mut p = 0u64;
            let handle = cu::CUipcMemHandle { reserved: rec.handle.map(|c| c as std::ffi::c_char) };
            // SAFETY: the context is current (prepare); out-pointers are live locals; `id` is
            // NUL-terminated and outlives the call; an opened mapping is recorded in `opened`
            // at once so that Drop closes it exactly once.
            unsafe {
                rc_ok(cu::cuDeviceGetByPCIBusId(&mut dj, id.as_ptr()), &format!("rank {j}'s GPU {} is not visible here", rec.bus_id))?;
                if dj != mine {
                    rc_ok(cu::cuDeviceCanAccessPeer(&mut can, mine, dj), "cuDeviceCanAccessPeer")?;
                    if can == 0 {
                        return Err(format!(
                            "this GPU cannot access the memory of rank {j}'s GPU {} (cuDeviceCanAccessPeer = 0)",
                            rec.bus_id
                        ));
                    }
                }
                let lazy = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
                rc_ok(cu::cuIpcOpenMemHandle_v2(&mut p, handle, lazy), &format!("opening rank {j}'s peer buffer (cuIpcOpenMemHandle)"))?;
            }
            self.opened.push(p);
            self.peers[j] = p;
        }
        Ok(())
    }

    /// The data area's size in bytes.
    pub fn buffer_bytes(&self) -> usize {
        self.opts.buffer_bytes
    }

    fn status(&self) -> u32 {
        // SAFETY: `words` is this backend's live mapped allocation of two u32 (set in prepare,
        // which succeeded for a backend in use); kernels write it, so it is read volatile.
        unsafe { std::ptr::read_volatile(self.words) }
    }

    fn set_abort_word(&self) {
        // SAFETY: as in `status`; the kernels read the abort word volatile.
        unsafe { std::ptr::write_volatile(self.words.add(1), 1) }
    }

    /// The error a nonzero status word stands for.
    fn status_error(&self, s: u32) -> Error {
        let (code, peer) = (s >> 24, ((s >> 16) & 0xff) as usize);
        let world = self.world_ranks.get(peer).copied().unwrap_or(peer);
        match code {
            1 => Error::Timeout {
                rank: self.world_rank(),
                op: format!("a peer-memory collective waiting for rank {world} (ipc)"),
                after: self.timeout,
            },
            _ => Error::Aborted {
                rank: self.world_rank(),
                reason: format!("a peer-memory collective gave up waiting for rank {world}: the job was aborted"),
            },
        }
    }

    fn world_rank(&self) -> usize {
        self.world_ranks.get(self.rank).copied().unwrap_or(self.rank)
    }

    /// Marks the backend unusable, raises the job's abort flag (so every rank fails) and
    /// returns `e`.
    fn fail(&mut self, e: Error) -> Error {
        if self.broken.is_none() {
            self.broken = Some(e.to_string());
        }
        if !self.words.is_null() {
            self.set_abort_word();
        }
        self.abort.raise(e.abort_info());
        e
    }

    fn usable(&mut self, during: &str) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::Aborted { rank: self.world_rank(), reason: format!("the peer-memory backend failed earlier: {why}") });
        }
        let s = self.status();
        if s != 0 {
            let e = self.status_error(s);
            return Err(self.fail(e));
        }
        self.abort.check(self.world_rank(), during)
    }

    /// The kernel for (`kind`, dtype, redop), compiled and loaded on first use. (Copy kernels
    /// serve every dtype: the key keeps the dtype anyway, one cheap entry each.)
    fn function(&mut self, kind: Kind, dtype: DType, redop: ReduceOp) -> Result<CudaFunction> {
        let key = (kind, dtype, redop);
        if let Some(f) = self.functions.get(&key) {
            return Ok(f.clone());
        }
        let rank = self.world_rank();
        let mkey = ModuleKey::of(kind, dtype, redop);
        let module = match self.modules.get(&mkey) {
            Some(m) => m.clone(),
            None => {
                let opts = cudarc::nvrtc::CompileOptions { arch: Some(self.arch), ..Default::default() };
                let shape = Shape {
                    nranks: self.size,
                    unroll: self.opts.unroll_for(self.size),
                    end_barrier: self.opts.end_barrier,
                    push: self.opts.push,
                };
                let ptx =
                    cudarc::nvrtc::compile_ptx_with_opts(kernels::source(mkey, shape), opts).map_err(|e| Error::BackendUnavailable {
                        rank,
                        backend: "nvrtc".into(),
                        why: format!("compiling the peer-memory kernels ({mkey:?}): {e:?}"),
                    })?;
                let m = self.dev.context().load_module(ptx).map_err(|e| cuda_err(rank, "loading the peer-memory kernels", e))?;
                self.modules.insert(mkey, m.clone());
                m
            }
        };
        let name = kind.name();
        let f = module.load_function(name).map_err(|e| cuda_err(rank, &format!("finding kernel `{name}`"), e))?;
        self.functions.insert(key, f.clone());
        Ok(f)
    }

    /// Enqueues one kernel over `args` on `stream`.
    fn launch(&mut self, f: &CudaFunction, args: &Args, loop_units: usize, stream: &CudaStream) -> Result<()> {
        let blocks = plan::blocks(loop_units, self.grid_cap) as u32;
        let mut params = [args as *const Args as *mut std::ffi::c_void];
        // SAFETY: `f` takes one `Args` by value (kernels.cu) and `params` points at it for the
        // call (the driver copies kernel arguments at launch); the stream belongs to this
        // device's context, which is current (collective binds it).
        let rc = unsafe {
            cu::cuLaunchKernel(
                f.cu_function(),
                blocks,
                1,
                1,
                THREADS as u32,
                1,
                1,
                0,
                stream.cu_stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if rc != cu::CUresult::CUDA_SUCCESS {
            let e = Error::BackendUnavailable { rank: self.world_rank(), backend: "ipc".into(), why: format!("cuLaunchKernel: {rc:?}") };
            return Err(self.fail(e));
        }
        Ok(())
    }
}

impl DeviceBackend for IpcBackend {
    fn name(&self) -> &'static str {
        "ipc"
    }

    fn supports(&self, d: &CollDesc) -> bool {
        plan::supports(d)
    }

    unsafe fn collective(&mut self, d: &CollDesc, send: Option<u64>, recv: u64, stream: &CudaStream) -> Result<()> {
        self.usable(d.op.name())?;
        let wr = self.world_rank();
        let Some(kind) = plan::kind(d, self.size, self.opts.two_shot_bytes_for(self.size)).filter(|_| plan::supports(d)) else {
            return Err(Error::BackendUnavailable {
                rank: wr,
                backend: "ipc".into(),
                why: format!("no peer-memory {} of {}", d.op.name(), d.dtype),
            });
        };
        if d.count == 0 {
            return Ok(());
        }
        let (n, r, es, c) = (self.size, self.rank, d.dtype.size(), d.count);
        // Row 0 of the input and of the output (rows are `c` elements apart).
        let (input, output) = match d.op {
            CollOp::AllReduce => (send.unwrap_or(recv), recv),
            CollOp::Broadcast => (recv, recv),
            CollOp::AllGather => (send.unwrap_or(recv + (r * c * es) as u64), recv),
            CollOp::ReduceScatter => match send {
                Some(s) => (s, recv),
                None => return Err(Error::invalid(wr, "send", "reduce_scatter over peer memory needs a separate send buffer")),
            },
            _ => unreachable!("plan::kind serves no other op"),
        };
        self.dev.context().bind_to_thread().map_err(|e| cuda_err(wr, "binding the context", e))?;
        let mut args = Args {
            peers: self.peers,
            status: self.words_dev,
            abort_word: self.words_dev + 4,
            timeout_ns: self.timeout.as_nanos().min(i64::MAX as u128) as i64,
            rank: r as i32,
            nranks: n as i32,
            root: d.root as i32,
            ..Args::default()
        };
        let rows = plan::rows_in_buffer(kind, n, self.opts.push);
        // A rank that cannot compile must not leave its peers spinning until the timeout.
        let f = self.function(kind, d.dtype, d.redop).map_err(|e| self.fail(e))?;
        args.in_pitch = (c * es) as i64;
        args.out_pitch = (c * es) as i64;
        // Launches alternate between the data area's halves (kernels.cu).
        let half = plan::half_bytes(self.opts.buffer_bytes);
        args.half = half as i64;
        for piece in plan::pieces(c, es, rows, half) {
            let off = (piece.start * es) as u64;
            let bytes = piece.len * es;
            args.input = input + off;
            args.output = output + off;
            args.count = bytes as i64;
            let slots = plan::slots(bytes);
            args.chunk = plan::chunk_len(slots, n) as i64;
            let loop_slots = if kind == Kind::TwoShot { args.chunk as usize } else { slots };
            self.launch(&f, &args, loop_slots, stream)?;
        }
        Ok(())
    }

    unsafe fn p2p(&mut self, _sends: &[(u64, usize, usize)], _recvs: &[(u64, usize, usize)], _stream: &CudaStream) -> Result<()> {
        Err(Error::BackendUnavailable { rank: self.world_rank(), backend: "ipc".into(), why: "peer memory serves collectives only".into() })
    }

    fn synchronize(&mut self, stream: &CudaStream) -> Result<()> {
        let mut w = Waiter::new(self.timeout, self.backoff);
        let wr = self.world_rank();
        let mut failure: Option<Error> = None;
        // After a failure: kernels see the abort word within a few polls; wait that long.
        let drain = Duration::from_secs(5).min(self.timeout);
        let never = AbortState::new();
        loop {
            // SAFETY: `stream` is borrowed for the call, so the CUstream it wraps is live.
            let q = unsafe { cu::cuStreamQuery(stream.cu_stream()) };
            match q {
                cu::CUresult::CUDA_SUCCESS => break,
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    let e = Error::BackendUnavailable { rank: wr, backend: "cuda".into(), why: format!("stream failed: {other:?}") };
                    return Err(self.fail(e));
                }
            }
            if failure.is_none() {
                if let Err(e) = w.pause(&self.abort, wr, &|| "waiting for the device stream (ipc)".to_string(), false) {
                    // A lost rank or the timeout: make our kernels give up, then wait for them
                    // (they return within a few polls) before reporting.
                    self.set_abort_word();
                    failure = Some(e);
                    w = Waiter::new(drain, self.backoff);
                }
            } else if w.pause(&never, wr, &|| "waiting for abandoned peer-memory kernels".into(), false).is_err() {
                break;
            }
        }
        if let Some(e) = failure {
            return Err(self.fail(e));
        }
        let s = self.status();
        if s != 0 {
            let e = self.status_error(s);
            return Err(self.fail(e));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(vars: &[(&str, &str)]) -> std::result::Result<IpcOptions, String> {
        IpcOptions::from_lookup(true, &|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn kernel_settings_come_from_the_environment_and_are_checked() {
        let d = opts(&[]).unwrap();
        assert_eq!((d.blocks, d.unroll, d.two_shot_bytes, d.push), (DEFAULT_BLOCKS, None, None, DEFAULT_PUSH));
        // Unset, the threshold and the unroll follow the communicator's ranks.
        assert_eq!((d.two_shot_bytes_for(2), d.unroll_for(2)), (2 << 20, 4));
        assert_eq!((d.two_shot_bytes_for(4), d.unroll_for(4)), (1 << 20, 2));
        assert_eq!((d.two_shot_bytes_for(8), d.unroll_for(8)), (512 << 10, 2));
        for n in 1..=plan::MAX_RANKS {
            assert!(plan::UNROLLS.contains(&d.unroll_for(n)) && d.two_shot_bytes_for(n) > 0, "n={n}");
            assert!(d.two_shot_bytes_for(n + 1) <= d.two_shot_bytes_for(n), "the crossover falls with the ranks");
        }
        assert!((1..=plan::MAX_BLOCKS).contains(&DEFAULT_BLOCKS));
        assert!(!d.end_barrier);
        let o = opts(&[
            ("SUCL_IPC_BLOCKS", "128"),
            ("SUCL_IPC_UNROLL", " 2 "),
            ("SUCL_IPC_TWO_SHOT_BYTES", "0"),
            ("SUCL_IPC_END_BARRIER", "1"),
            ("SUCL_IPC_PUSH", "0"),
        ])
        .unwrap();
        assert_eq!((o.blocks, o.unroll, o.two_shot_bytes, o.end_barrier, o.push), (128, Some(2), Some(0), true, false));
        let s = o.kernel_settings(4);
        assert_eq!((s.blocks, s.unroll, s.two_shot_bytes, s.end_barrier, s.push), (128, 2, 0, true, false));
        let s = opts(&[("SUCL_IPC_UNROLL", "8")]).unwrap().kernel_settings(4);
        assert_eq!((s.unroll, s.two_shot_bytes, s.push), (8, 1 << 20, DEFAULT_PUSH), "a set unroll wins at any size");
        for (k, v, says) in [
            ("SUCL_IPC_BLOCKS", "0", "at least 1"),
            ("SUCL_IPC_BLOCKS", "129", "1 to 128"),
            ("SUCL_IPC_BLOCKS", "many", "SUCL_IPC_BLOCKS=\"many\""),
            ("SUCL_IPC_UNROLL", "3", "one of [1, 2, 4, 8]"),
            ("SUCL_IPC_UNROLL", "16", "one of"),
            ("SUCL_IPC_UNROLL", "0", "at least 1"),
            ("SUCL_IPC_END_BARRIER", "2", "0 or 1"),
            ("SUCL_IPC_PUSH", "yes", "SUCL_IPC_PUSH=\"yes\""),
            ("SUCL_IPC_PUSH", "2", "0 or 1"),
        ] {
            let e = opts(&[(k, v)]).unwrap_err();
            assert!(e.contains(k) && e.contains(says), "{k}={v}: {e}");
        }
    }
}
