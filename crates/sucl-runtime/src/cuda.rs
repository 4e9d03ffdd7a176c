//! CUDA device memory through the same [`Communicator`] calls as host memory (feature `cuda`).
//!
//! A call whose buffers are device [`Buffer`]s runs on the device backends: NCCL, enqueued on
//! the queue of the buffer it writes with no host synchronization, or the staged path (device →
//! pinned host → the communicator's host backend → device, pipelined in chunks), chosen per op
//! and size like host calls. Staged collectives are stream-ordered too: the stream triggers a
//! progress thread per chunk and waits for it (the `staged` module), so the call returns
//! once enqueued; their errors surface at [`Communicator::synchronize`] and later calls. The communicator sets up its device side (one GPU, the NCCL
//! communicator) at its first device collective, or at [`Communicator::attach_device`].
//! [`Communicator::synchronize`] waits for a queue while watching NCCL for asynchronous errors.

use crate::buf::{Mem, MemMut};
use crate::select::Selector;
use crate::staged::StagedProgress;
use crate::{Communicator, Error, Result};
use std::cell::RefMut;
use std::sync::Arc;
use sucl_core::backend::{CollDesc, CollOp};
use sucl_cuda::cudarc::driver::sys as cu;
use sucl_cuda::{DeviceBackend, DeviceMemory, DeviceMemoryMut, IpcBackend, IpcOptions, NcclBackend, StreamSignal};

pub use sucl_cuda::cudarc::driver::sys::CUstream;
pub use sucl_cuda::ipc::peer_access_report;
pub use sucl_cuda::{
    driver_available, driver_version, nccl_version, pointer_device, probe, Buffer, BufferView, BufferViewMut, Device, DeviceElement, Event,
    ForeignBuffer, Kernel, PinnedBuffer, Queue,
};

/// Bytes of one stage (all rows of one chunk) on the staged path.
const STAGE_BYTES: usize = 4 << 20;

/// Default of `SUCL_STAGED_LANES`: progress threads whose host collectives run at once on the
/// staged path. The staged path's time is its host collectives' (each rank's share runs on one
/// thread: on 4 × H100's host one 4 MiB shm all_reduce took 0.78 ms on 2 ranks, 1.35 ms on 4,
/// while the copies of a chunk to and from the GPU take about 0.16 ms at 50 GB/s), so
/// chunks go round-robin to this many threads, each with its own communicator.
pub const DEFAULT_STAGED_LANES: usize = 4;
/// Most staged lanes.
pub const MAX_STAGED_LANES: usize = 8;

/// The staged lanes `SUCL_STAGED_LANES` asks for (1 to [`MAX_STAGED_LANES`]; every rank must
/// use the same), else [`DEFAULT_STAGED_LANES`].
pub fn staged_lanes(lookup: &dyn Fn(&str) -> Option<String>) -> std::result::Result<usize, String> {
    match lookup("SUCL_STAGED_LANES") {
        None => Ok(DEFAULT_STAGED_LANES),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_STAGED_LANES).contains(n))
            .ok_or_else(|| format!("SUCL_STAGED_LANES={v:?}: want 1 to {MAX_STAGED_LANES}")),
    }
}

/// One pinned staging area and an event after the last stream work that used it.
struct Slot {
    mem: PinnedBuffer<u8>,
    uploaded: Option<Arc<Event>>,
}

/// A communicator's device side: its GPU, NCCL (when every rank can load it) and the staged
/// path's pinned slots and progress thread.
pub(crate) struct DeviceComm {
    dev: Device,
    nccl: Option<NcclBackend>,
    /// Peer memory, when every rank's GPU can reach every other's.
    ipc: Option<IpcBackend>,
    /// Why peer memory is not set up, if it is not.
    ipc_why: Option<String>,
    slots: Vec<Slot>,
    /// Rank 0's device selection rules, resolved against the device backends loaded.
    selector: Selector,
    /// One byte the NCCL barrier reduces.
    scratch: Option<Buffer<u8>>,
    /// The staged collectives' progress threads (lanes), started at the first one.
    progress: Vec<StagedProgress>,
}

impl Drop for DeviceComm {
    /// Pinned slots are freed only after the stream work that uses them ran (bounded; on a
    /// timeout they are leaked rather than freed under a copy). The progress thread ends first.
    fn drop(&mut self) {
        let stuck = self.slots.iter().any(|s| s.uploaded.as_ref().is_some_and(|e| e.synchronize().is_err()));
        if stuck {
            std::mem::forget(std::mem::take(&mut self.slots));
        }
        self.progress.clear();
    }
}

/// Test-only fault hook for `scripts/gpu-check.sh` (built only with the `fault-hook` feature,
/// like `SUCL_FAULT_CORRUPT`): with `SUCL_TEST_NCCL_INIT_FAULT=R:exit`, world rank R exits
/// (status 3) just before it joins NCCL; with `R:stall` it stops answering there (sleeps 120 s,
/// store connection open). The other ranks' NCCL setup must then fail — naming the lost rank, or
/// after `SUCL_TIMEOUT` — instead of hanging. Read once per device setup, never on a
/// communication path.
#[cfg(feature = "fault-hook")]
fn nccl_init_fault_hook(world_rank: usize) {
    let Ok(spec) = std::env::var("SUCL_TEST_NCCL_INIT_FAULT") else { return };
    let Some((rank, fault)) = spec.split_once(':') else { return };
    if rank.trim().parse::<usize>().ok() != Some(world_rank) {
        return;
    }
    match fault.trim() {
        "exit" => {
            eprintln!("injected fault: rank {world_rank} exits before joining NCCL");
            std::process::exit(3);
        }
        "stall" => {
            eprintln!("injected fault: rank {world_rank} stops answering before joining NCCL");
            std::thread::sleep(std::time::Duration::from_secs(120));
            std::process::exit(5);
        }
        other => eprintln!("SUCL_TEST_NCCL_INIT_FAULT: unknown fault {other:?} (exit or stall); ignored"),
    }
}

/// Where two ranks drive the same physical GPU (equal UUIDs), the sentence saying which.
fn shared_gpu(gpus: &[String]) -> Option<String> {
    for (a, ga) in gpus.iter().enumerate() {
        if let Some(b) = gpus[a + 1..].iter().position(|gb| gb == ga) {
            return Some(format!("ranks {a} and {} share one GPU ({ga})", a + 1 + b));
        }
    }
    None
}

impl Communicator {
    /// Opens this rank's GPU: local rank modulo the number of devices, with this job's timeout
    /// and lost-rank detection on every wait. Not collective.
    pub fn cuda_device(&self) -> Result<Device> {
        let wr = self.wr();
        let n = probe().map_err(|why| Error::BackendUnavailable { rank: wr, backend: "cuda".into(), why })?;
        let h = &self.ctx.cfg.host;
        Device::open_for(self.local_rank() % n, wr, h.timeout, h.backoff, self.ctx.abort.clone())
    }

    /// The GPU this communicator's calls on device buffers run on, once set up (by [`Communicator::attach_device`]
    /// or a first device collective); `None` before.
    pub fn attached_device(&self) -> Option<Device> {
        self.device.borrow().as_ref().map(|d| d.dev.clone())
    }

    /// GPU `ordinal` with this job's timeout and lost-rank detection on every wait: the attached
    /// GPU when it is that one (no driver call), else opened. Not collective.
    pub fn cuda_device_at(&self, ordinal: usize) -> Result<Device> {
        if let Some(d) = self.device.borrow().as_ref().filter(|d| d.dev.ordinal() == ordinal) {
            return Ok(d.dev.clone());
        }
        let h = &self.ctx.cfg.host;
        Device::open_for(ordinal, self.wr(), h.timeout, h.backoff, self.ctx.abort.clone())
    }

    /// Sets up device communication on `dev`: NCCL when every rank can load it, else the staged
    /// path alone. Collective. Device collectives do this on first use; device point-to-point
    /// calls need it done first, since only two ranks take part in them.
    pub fn attach_device(&self, dev: &Device) -> Result<()> {
        self.device_state(dev).map(|_| ())
    }

    fn device_state(&self, dev: &Device) -> Result<RefMut<'_, DeviceComm>> {
        let wr = self.wr();
        {
            let cur = self.device.borrow();
            if let Some(c) = cur.as_ref() {
                if c.dev.ordinal() != dev.ordinal() {
                    return Err(Error::invalid(
                        wr,
                        "buffer",
                        format!("is on GPU {} but this communicator communicates on GPU {}", dev.ordinal(), c.dev.ordinal()),
                    ));
                }
            }
        }
        if self.device.borrow().is_none() {
            let state = self.make_device_comm(dev)?;
            *self.device.borrow_mut() = Some(state);
        }
        Ok(RefMut::map(self.device.borrow_mut(), |d| d.as_mut().expect("set above")))
    }

    fn make_device_comm(&self, dev: &Device) -> Result<DeviceComm> {
        let wr = self.wr();
        let store = self.ctx.store.as_ref().ok_or_else(|| Error::Config("no rendezvous store".into()))?;
        let k = self.splits.get() + 1;
        self.splits.set(k);
        let key = format!("{}/gpu{k}", self.prefix);
        let allowed = self.ctx.cfg.platforms.get("cuda").is_none_or(|p| p.backends.iter().any(|b| b == "nccl"));
        let mine = nccl_version().is_ok() && allowed;
        // Each rank says whether it can load NCCL and which physical GPU it drives: NCCL refuses
        // a communicator with two ranks on one GPU, so such a job stages through host memory.
        let uuid = dev.uuid_hex()?;
        store.set(&format!("{key}/nccl/{}", self.rank), format!("{}:{uuid}", u8::from(mine)).as_bytes())?;
        let mut all = true;
        let mut gpus: Vec<String> = Vec::with_capacity(self.size);
        for r in 0..self.size {
            let v = store.get(&format!("{key}/nccl/{r}"))?;
            let v = String::from_utf8_lossy(&v);
            let (can, gpu) = v.split_once(':').unwrap_or(("0", ""));
            all &= can == "1";
            gpus.push(gpu.to_string());
        }
        let shared = shared_gpu(&gpus);
        if let Some(why) = &shared {
            if all {
                tracing::info!(rank = wr, "{why}: NCCL refuses that, so calls on device buffers are staged through host memory");
            }
            all = false;
        }
        let nccl = if all {
            let id = if self.rank == 0 {
                let id = sucl_cuda::nccl_unique_id().map_err(|why| Error::BackendUnavailable { rank: wr, backend: "nccl".into(), why })?;
                store.set(&format!("{key}/nccl-id"), &id)?;
                id
            } else {
                store.get(&format!("{key}/nccl-id"))?
            };
            #[cfg(feature = "fault-hook")]
            nccl_init_fault_hook(wr);
            let h = &self.ctx.cfg.host;
            Some(NcclBackend::new(dev, &id, self.rank, self.size, wr, self.ctx.abort.clone(), h.timeout, h.backoff)?)
        } else {
            tracing::info!(rank = wr, "NCCL is not usable on every rank; calls on device buffers are staged through host memory");
            None
        };
        let (ipc, ipc_why) = match self.setup_ipc(dev, k)? {
            Ok(b) => (Some(b), None),
            Err(why) => {
                tracing::info!(rank = wr, "peer memory (ipc) not used: {why}");
                (None, Some(why))
            }
        };
        let mut names: Vec<&'static str> = vec![];
        names.extend(nccl.is_some().then_some("nccl"));
        names.extend(ipc.is_some().then_some("ipc"));
        names.push("staged");
        let selector = Selector::new(&self.ctx.policy.for_devices_with(shared.is_none()), &names, self.size);
        Ok(DeviceComm { dev: dev.clone(), nccl, ipc, ipc_why, slots: vec![], selector, scratch: None, progress: vec![] })
    }

    /// Sets up the peer-memory backend (collective): every rank takes part, even one whose
    /// configuration leaves `ipc` out, so that all agree. `Ok(Err(why))` where it cannot serve.
    fn setup_ipc(&self, dev: &Device, k: u64) -> Result<std::result::Result<IpcBackend, String>> {
        let allowed = self.ctx.cfg.platforms.get("cuda").is_none_or(|p| p.backends.iter().any(|b| b == "ipc"));
        let opts = IpcOptions::from_env(allowed).map_err(Error::Config)?;
        let h = &self.ctx.cfg.host;
        let mut exchange = |what: &str, bytes: &[u8]| self.oob_all_gather(&format!("gpu{k}/{what}"), bytes);
        IpcBackend::setup(
            dev,
            self.rank,
            self.size,
            self.world_ranks.clone(),
            self.ctx.abort.clone(),
            h.timeout,
            h.backoff,
            opts,
            &mut exchange,
        )
    }

    /// Why this communicator's calls on device buffers do not use peer memory (`None` where they may, or
    /// before the device side is set up).
    pub fn ipc_unavailable_reason(&self) -> Option<String> {
        self.device.borrow().as_ref().and_then(|d| d.ipc_why.clone())
    }

    /// The device backends this communicator set up (empty before its first call on device buffers).
    pub fn device_backends(&self) -> Vec<&'static str> {
        self.device.borrow().as_ref().map_or(vec![], |d| d.selector.names().to_vec())
    }

    /// The device backend a collective `op` on `bytes` bytes would use: a pinned one, the
    /// tuning table's rules naming `nccl`, `ipc` or `staged`, the default peer-memory rules,
    /// then the `cuda` platform threshold (below it staged), else NCCL when loaded. (A call
    /// that peer memory cannot serve — an op, dtype or reduce op its kernels lack — goes to NCCL,
    /// else staged.)
    pub fn device_backend_for(&self, op: CollOp, bytes: usize) -> &'static str {
        if let Some(f) = self.device_pin.get() {
            return f;
        }
        match self.device.borrow().as_ref() {
            Some(d) => d.selector.names()[d.selector.pick(op, bytes as u64)],
            None => "staged",
        }
    }

    /// Waits (bounded) until everything enqueued on `queue` ran, failing — on every rank — when
    /// NCCL reports an asynchronous error, a rank is lost or the timeout passes (NCCL is then
    /// aborted so that no kernel stays hung).
    /// A staged collective that failed on its progress thread (its stream was released) is
    /// reported here too.
    pub fn synchronize(&self, queue: &Queue) -> Result<()> {
        let mut guard = self.device.borrow_mut();
        let Some(d) = guard.as_mut() else { return queue.synchronize() };
        // Peer-memory kernels report through their status word; a failure there raises the
        // job's abort flag, and NCCL's wait then aborts NCCL too (no kernel stays hung).
        let ipc = d.ipc.as_mut().map_or(Ok(()), |i| i.synchronize(queue.stream()));
        let rest = match d.nccl.as_mut() {
            Some(n) => n.synchronize(queue.stream()),
            None if ipc.is_ok() => queue.synchronize(),
            None => Ok(()),
        };
        ipc.and(rest)?;
        match d.progress.iter().find_map(|p| p.error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Orders every rank on `queue`: work enqueued after it starts once every rank reached it.
    /// Over NCCL the CPU does not wait; staged, it waits for the queue and then for every rank.
    pub fn barrier_on(&self, queue: &Queue) -> Result<()> {
        self.device_state(queue.device())?;
        if self.device_backend_for(CollOp::Barrier, 0) == "nccl" {
            let mut guard = self.device_state(queue.device())?;
            let st = &mut *guard;
            let scratch = match &mut st.scratch {
                Some(b) => b,
                none => none.insert(queue.device().queue()?.alloc::<u8>(1)?),
            };
            let (p, _g) = scratch.write_ptr(queue.stream());
            let n = st.nccl.as_mut().ok_or_else(|| self.nccl_missing())?;
            // SAFETY: `p` is the scratch buffer's one byte (a barrier reduces one byte in place),
            // allocated on this device; the buffer lives in the device state until the
            // communicator goes, and its write guard orders later use after `queue`'s work.
            return unsafe { n.collective(&CollDesc::BARRIER, None, p, queue.stream()) };
        }
        queue.synchronize()?;
        self.barrier()
    }

    pub(crate) fn mixed_memory(&self) -> Error {
        Error::invalid(self.wr(), "buffers", "mix host and device memory: one call's buffers must all be host or all be device memory")
    }

    #[allow(clippy::type_complexity)]
    fn device_mem<'s, 'r>(
        &self,
        send: Option<Mem<'s>>,
        recv: Option<MemMut<'r>>,
    ) -> Result<(Option<&'s dyn DeviceMemory>, Option<&'r mut dyn DeviceMemoryMut>)> {
        let s = match send {
            None => None,
            Some(Mem::Device(m)) => Some(m),
            Some(Mem::Host(_)) => return Err(self.mixed_memory()),
        };
        let r = match recv {
            None => None,
            Some(MemMut::Device(m)) => Some(m),
            Some(MemMut::Host(_)) => return Err(self.mixed_memory()),
        };
        Ok((s, r))
    }

    /// A collective on device memory (see [`Communicator`]'s `call`).
    pub(crate) fn device_call(&self, d: CollDesc, send: Option<Mem<'_>>, recv: Option<MemMut<'_>>) -> Result<()> {
        let (send, mut recv) = self.device_mem(send, recv)?;
        let queue = match (&recv, send) {
            (Some(r), _) => r.queue().clone(),
            (None, Some(s)) => s.queue().clone(),
            (None, None) => return Err(Error::invalid(self.wr(), "buffers", "a call on device buffers needs at least one buffer")),
        };
        if let Some(s) = send {
            if s.queue().device().ordinal() != queue.device().ordinal() {
                return Err(Error::invalid(self.wr(), "send", "is on another GPU than recv"));
            }
        }
        self.device_state(queue.device())?;
        let bytes = crate::select::selection_bytes(&d, self.size) as usize;
        let which = self.device_backend_for(d.op, bytes);
        tracing::debug!(op = d.op.name(), count = d.count, dtype = d.dtype.name(), backend = which, "device collective");
        let stream = queue.stream();
        let (sp, _gs) = send.map_or((None, None), |s| {
            let (p, g) = s.read_ptr(stream);
            (Some(p), g)
        });
        #[cfg(feature = "fault-hook")]
        let recv_bytes = recv.as_ref().map_or(0, |r| r.num_bytes());
        let (rp, _gr) = recv.as_mut().map_or((0, None), |r| r.write_ptr(stream));
        let mut st = self.device_state(queue.device())?;
        // Peer memory serves some ops, dtypes and reduce ops; the rest go to NCCL (else staged).
        let which = match which {
            "ipc" if st.ipc.as_ref().is_some_and(|i| i.supports(&d)) && (d.op != CollOp::ReduceScatter || sp.is_some()) => "ipc",
            "ipc" if st.nccl.is_some() => "nccl",
            "ipc" => "staged",
            w => w,
        };
        let done = if which == "ipc" {
            let i = st.ipc.as_mut().expect("checked above");
            // SAFETY: as for NCCL below: the buffers were validated against `d`, are borrowed
            // until we return, and their guards record the use on `stream`.
            unsafe { i.collective(&d, sp, rp, stream) }
        } else if which == "nccl" {
            let Some(n) = st.nccl.as_mut() else { return Err(self.nccl_missing()) };
            if d.count == 0 {
                // Nothing moves; NCCL is not asked to handle null buffers.
                return Ok(());
            }
            // SAFETY: `sp`/`rp` come from the caller's buffers, validated against `d` (sizes,
            // device) before this call; they are borrowed until we return, and their guards
            // (`_gs`, `_gr`) record the use on `stream`, so freeing them waits for it.
            unsafe { n.collective(&d, sp, rp, stream) }
        } else {
            st.staged(self, &d, sp, rp, &queue)
        };
        #[cfg(feature = "fault-hook")]
        if done.is_ok() && rp != 0 && crate::fault::hits(which, d.op) {
            if let Some(at) = crate::fault::corrupt_offset(recv_bytes, d.dtype.size()) {
                // Test builds only: read the byte back after the collective, flip it, write it.
                let mut b = st.download(rp + at as u64, 1, &queue)?;
                b[0] ^= crate::fault::FLIP;
                st.upload_from(&b, rp + at as u64, &queue)?;
            }
        }
        done
    }

    fn nccl_missing(&self) -> Error {
        Error::BackendUnavailable { rank: self.wr(), backend: "nccl".into(), why: "not usable on every rank of this communicator".into() }
    }

    fn p2p_backend(&self, queue: &Queue, what: &str) -> Result<(RefMut<'_, DeviceComm>, bool)> {
        if self.device.borrow().is_none() {
            return Err(Error::invalid(
                self.wr(),
                "buffer",
                format!("device {what} needs the communicator's device set up first: call attach_device (collective) or run a device collective"),
            ));
        }
        let st = self.device_state(queue.device())?;
        let nccl = st.nccl.is_some() && self.device_pin.get() != Some("staged");
        Ok((st, nccl))
    }

    /// Enqueues point-to-point transfers on `queue` as one NCCL group, with no host wait (for
    /// layers that batch operations, like stream-triggered queues). `sends` and `recvs` are
    /// (device address, bytes, peer); NCCL matches them per peer in call order, without tags.
    /// An error unless this communicator's device point-to-point runs over NCCL.
    ///
    /// # Safety
    /// Every address must be device memory of `queue`'s GPU, valid for its byte count until the
    /// stream ran the transfers, and not written by other work the stream does not order.
    pub unsafe fn nccl_group_p2p(&self, sends: &[(u64, usize, usize)], recvs: &[(u64, usize, usize)], queue: &Queue) -> Result<()> {
        for &(_, _, peer) in sends.iter().chain(recvs) {
            self.check_rank("peer", peer)?;
        }
        let (mut st, nccl) = self.p2p_backend(queue, "group")?;
        if !nccl {
            return Err(self.nccl_missing());
        }
        st.nccl.as_mut().expect("nccl").p2p(sends, recvs, queue.stream())
    }

    pub(crate) fn device_send(&self, m: &dyn DeviceMemory, dest: usize, tag: u32) -> Result<()> {
        let q = m.queue().clone();
        let (mut st, nccl) = self.p2p_backend(&q, "send")?;
        let (p, _g) = m.read_ptr(q.stream());
        if nccl {
            // SAFETY: `p` addresses `m`'s `num_bytes()` bytes on `q`'s device; `m` is borrowed
            // until we return and its guard `_g` records the read on `q`.
            return unsafe { st.nccl.as_mut().expect("nccl").p2p(&[(p, m.num_bytes(), dest)], &[], q.stream()) };
        }
        let host = st.download(p, m.num_bytes(), &q)?;
        drop(st);
        self.send(&host[..], dest, tag)
    }

    pub(crate) fn device_recv(&self, m: &mut dyn DeviceMemoryMut, src: usize, tag: u32) -> Result<usize> {
        let q = m.queue().clone();
        let len = m.num_bytes();
        let (mut st, nccl) = self.p2p_backend(&q, "recv")?;
        let (p, _g) = m.write_ptr(q.stream());
        if nccl {
            // SAFETY: `p` addresses `m`'s `len` bytes on `q`'s device; `m` is mutably borrowed
            // until we return and its guard `_g` records the write on `q`.
            unsafe { st.nccl.as_mut().expect("nccl").p2p(&[], &[(p, len, src)], q.stream())? };
            return Ok(len);
        }
        drop(st);
        let mut host = vec![0u8; len];
        let n = self.recv(&mut host[..], src, tag)?.count;
        self.device_state(q.device())?.upload_from(&host[..n], p, &q)?;
        Ok(n)
    }

    pub(crate) fn device_sendrecv(
        &self,
        s: &dyn DeviceMemory,
        dest: usize,
        r: &mut dyn DeviceMemoryMut,
        src: usize,
        tag: u32,
    ) -> Result<usize> {
        let q = r.queue().clone();
        let len = r.num_bytes();
        if s.queue().device().ordinal() != q.device().ordinal() {
            return Err(Error::invalid(self.wr(), "send", "is on another GPU than recv"));
        }
        let (mut st, nccl) = self.p2p_backend(&q, "sendrecv")?;
        let (sp, _gs) = s.read_ptr(q.stream());
        let (rp, _gr) = r.write_ptr(q.stream());
        if nccl {
            // SAFETY: `sp`/`rp` address `s`'s and `r`'s whole buffers, both on `q`'s device
            // (checked above); both are borrowed until we return and their guards record the
            // use on `q`.
            unsafe { st.nccl.as_mut().expect("nccl").p2p(&[(sp, s.num_bytes(), dest)], &[(rp, len, src)], q.stream())? };
            return Ok(len);
        }
        let out = st.download(sp, s.num_bytes(), &q)?;
        drop(st);
        let mut host = vec![0u8; len];
        let n = self.sendrecv(&out[..], dest, &mut host[..], src, tag)?.count;
        self.device_state(q.device())?.upload_from(&host[..n], rp, &q)?;
        Ok(n)
    }
}

/// How one rank's buffers of a collective split into rows: the staged path moves, per chunk,
/// the same column range of every row.
struct Rows {
    send: usize,
    recv: usize,
    /// Download into the receive rows at this row (the host collective then runs in place).
    in_place_row: Option<usize>,
}

fn rows(d: &CollDesc, n: usize, r: usize) -> Rows {
    let root = r == d.root;
    let (send, recv, in_place_row) = match d.op {
        CollOp::Barrier => (0, 0, None),
        CollOp::AllReduce => (0, 1, Some(0)),
        // Receivers download nothing; the host broadcast runs in place on every rank.
        CollOp::Broadcast => (0, 1, root.then_some(0)),
        CollOp::Reduce if root => (0, 1, Some(0)),
        CollOp::Reduce => (1, 0, None),
        CollOp::AllGather => (0, n, Some(r)),
        CollOp::Gather if root => (1, n, None),
        CollOp::Gather => (1, 0, None),
        CollOp::Scatter if root => (n, 1, None),
        CollOp::Scatter => (0, 1, None),
        CollOp::AllToAll => (n, n, None),
        CollOp::ReduceScatter => (n, 1, None),
    };
    Rows { send, recv, in_place_row }
}

/// Largest number of rows any rank stages per chunk: the chunk size must agree on every rank.
fn max_rows(op: CollOp, n: usize) -> usize {
    match op {
        CollOp::Barrier | CollOp::AllReduce | CollOp::Broadcast | CollOp::Reduce => 1,
        CollOp::AllGather => n,
        CollOp::Gather | CollOp::Scatter | CollOp::ReduceScatter => n + 1,
        CollOp::AllToAll => 2 * n,
    }
}

/// Copies `height` rows of `width` bytes between device memory (row pitch `dpitch`) and packed
/// host memory, enqueued on `stream`.
///
/// # Safety
/// The device rows and `host[..height * width]` must be valid until the stream ran the copy.
unsafe fn copy_rows(
    to_host: bool,
    dev: u64,
    dpitch: usize,
    host: *mut u8,
    width: usize,
    height: usize,
    stream: cu::CUstream,
) -> cu::CUresult {
    if width == 0 || height == 0 {
        return cu::CUresult::CUDA_SUCCESS;
    }
    let (dev_t, host_t) = (cu::CUmemorytype::CU_MEMORYTYPE_DEVICE, cu::CUmemorytype::CU_MEMORYTYPE_HOST);
    let p = cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: if to_host { dev_t } else { host_t },
        srcHost: if to_host { std::ptr::null() } else { host as *const std::ffi::c_void },
        srcDevice: if to_host { dev } else { 0 },
        srcArray: std::ptr::null_mut(),
        srcPitch: if to_host { dpitch } else { width },
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: if to_host { host_t } else { dev_t },
        dstHost: if to_host { host as *mut std::ffi::c_void } else { std::ptr::null_mut() },
        dstDevice: if to_host { 0 } else { dev },
        dstArray: std::ptr::null_mut(),
        dstPitch: if to_host { width } else { dpitch },
        WidthInBytes: width,
        Height: height,
    };
    if height == 1 || dpitch <= i32::MAX as usize {
        return cu::cuMemcpy2DAsync_v2(&p, stream);
    }
    // Pitches over the driver's limit: one copy per row.
    for row in 0..height {
        let mut q = p;
        q.Height = 1;
        if to_host {
            q.srcDevice = dev + (row * dpitch) as u64;
            q.dstHost = host.add(row * width) as *mut std::ffi::c_void;
        } else {
            q.srcHost = host.add(row * width) as *const std::ffi::c_void;
            q.dstDevice = dev + (row * dpitch) as u64;
        }
        let rc = cu::cuMemcpy2DAsync_v2(&q, stream);
        if rc != cu::CUresult::CUDA_SUCCESS {
            return rc;
        }
    }
    cu::CUresult::CUDA_SUCCESS
}

impl DeviceComm {
    fn cuda_err(&self, during: &str, rc: cu::CUresult) -> Result<()> {
        if rc == cu::CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        Err(Error::BackendUnavailable { rank: self.dev.rank(), backend: "cuda".into(), why: format!("{during}: {rc:?}") })
    }

    /// At least `count` pinned slots of at least `bytes` each, with no upload still reading them.
    fn ensure_slots(&mut self, count: usize, bytes: usize) -> Result<()> {
        if self.slots.len() >= count && self.slots.iter().all(|s| s.mem.len() >= bytes) {
            return Ok(());
        }
        let count = count.max(self.slots.len());
        for s in &self.slots {
            if let Some(e) = &s.uploaded {
                e.synchronize()?;
            }
        }
        self.slots.clear();
        for _ in 0..count {
            self.slots.push(Slot { mem: self.dev.alloc_pinned::<u8>(bytes.max(1))?, uploaded: None });
        }
        Ok(())
    }

    /// Waits until slot `b`'s last upload has read it, so the host may overwrite it.
    fn slot_free(&mut self, b: usize) -> Result<()> {
        if let Some(e) = self.slots[b].uploaded.take() {
            e.synchronize()?;
        }
        Ok(())
    }

    /// Device → pinned host, waiting for the copy (point-to-point staging).
    fn download(&mut self, src: u64, bytes: usize, q: &Queue) -> Result<Vec<u8>> {
        let mut host = vec![0u8; bytes];
        if bytes > 0 {
            self.ensure_slots(1, bytes)?;
            self.slot_free(0)?;
            let buf = self.slots[0].mem.as_mut_slice()?.as_mut_ptr();
            // SAFETY: `src` covers `bytes` (the buffer's size); the slot holds at least `bytes`.
            let rc = unsafe { copy_rows(true, src, bytes, buf, bytes, 1, q.stream().cu_stream()) };
            self.cuda_err("device to host", rc)?;
            q.synchronize()?;
            host.copy_from_slice(&self.slots[0].mem.as_slice()?[..bytes]);
        }
        Ok(host)
    }

    /// Host → device through a pinned slot, ordered on `q`; waits for the copy.
    fn upload_from(&mut self, host: &[u8], dst: u64, q: &Queue) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        self.ensure_slots(1, host.len())?;
        self.slot_free(0)?;
        let buf = self.slots[0].mem.as_mut_slice()?;
        buf[..host.len()].copy_from_slice(host);
        let p = buf.as_mut_ptr();
        // SAFETY: `dst` covers `host.len()` bytes (at most the receive buffer's size).
        let rc = unsafe { copy_rows(false, dst, host.len(), p, host.len(), 1, q.stream().cu_stream()) };
        self.cuda_err("host to device", rc)?;
        q.synchronize()
    }

    /// Device → pinned host → the communicator's host backend → device, in chunks: chunk k is
    /// the same column range of every row of the buffers, an independent host collective of
    /// its own. Stream-ordered and returning once enqueued: per chunk the caller's stream runs
    /// the downloads into a pinned slot and triggers a progress thread (see `crate::staged`),
    /// which runs the chunk's host collective; the stream waits for its completion, then runs
    /// the uploads. Chunk k goes to lane k mod L (L progress threads, each with its own
    /// communicator, so L host collectives run at once); chunks k + 1 … k + L are downloaded
    /// and triggered before chunk k's wait, so the host collectives overlap each other and the
    /// copies. L + 1 slots rotate, reused in stream order. The host blocks only to grow the
    /// slots (once per larger size).
    fn staged(&mut self, comm: &Communicator, d: &CollDesc, send: Option<u64>, recv: u64, q: &Queue) -> Result<()> {
        let (n, r, es) = (comm.size(), comm.rank(), d.dtype.size());
        let rw = rows(d, n, r);
        let per = (STAGE_BYTES / (max_rows(d.op, n) * es)).max(1);
        let chunks = d.count.div_ceil(per).max(1);
        let pitch = d.count * es;
        let width = |k: usize| (d.count - (k * per).min(d.count)).min(per) * es;
        if self.progress.is_empty() {
            // Collective, like the call itself: every rank reaches its first staged collective
            // at the same point of its sequence, and makes its lanes in the same order.
            let lanes = staged_lanes(&|k| std::env::var(k).ok()).map_err(Error::Config)?;
            for _ in 0..lanes {
                let dup = comm.split(Some(0), comm.rank() as i64)?.ok_or_else(|| Error::Config("duplicating the communicator".into()))?;
                self.progress.push(StagedProgress::start(dup)?);
            }
        }
        let lanes = self.progress.len();
        // Chunks in flight beyond the one being waited for, and the slots they rotate through.
        let ahead = lanes.min(chunks.saturating_sub(1)).max(1);
        let depth = ahead + 1;
        self.ensure_slots(depth, (rw.send + rw.recv) * width(0))?;
        let rank = self.dev.rank();
        let ck = move |during: &str, rc: cu::CUresult| -> Result<()> {
            if rc == cu::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
            Err(Error::BackendUnavailable { rank, backend: "cuda".into(), why: format!("{during}: {rc:?}") })
        };
        if let Some(e) = self.progress.iter().find_map(|p| p.error()) {
            return Err(e);
        }
        let stream = q.stream();
        let mut indices = Vec::with_capacity(lanes);
        for p in &mut self.progress {
            indices.push(p.stream_index(&self.dev, stream)?);
        }
        let bound = self.progress[0].bound();
        let s = stream.cu_stream();
        // Earlier staged work on another stream (or a point-to-point staging) may still use
        // the slots: this stream waits for it, the CPU does not.
        let mut bases = Vec::with_capacity(self.slots.len());
        for slot in self.slots.iter_mut() {
            if let Some(ev) = &slot.uploaded {
                q.wait_for(ev)?;
            }
            bases.push(slot.mem.as_mut_slice()?.as_mut_ptr() as usize);
        }
        let base_of = |k: usize| bases[k % depth];
        let src_in_place = send.unwrap_or(recv);
        let in_place = rw.in_place_row.is_some() || d.op == CollOp::Broadcast;
        let download = |k: usize| -> cu::CUresult {
            let (w, off, base) = (width(k), (k * per * es) as u64, base_of(k) as *mut u8);
            // SAFETY: every row lies inside the caller's (validated) buffers; the slot holds
            // (send rows + recv rows) × width(0) ≥ that many × w bytes, and stream order puts
            // this copy after the last upload that read the slot (chunk k − depth's, enqueued
            // before this chunk's download).
            unsafe {
                if let Some(row) = rw.in_place_row {
                    let src = if d.op == CollOp::AllGather { send.unwrap_or(recv + (r * pitch) as u64) } else { src_in_place };
                    copy_rows(true, src + off, pitch, base.add(rw.send * w + row * w), w, 1, s)
                } else if rw.send > 0 {
                    copy_rows(true, send.unwrap_or(recv) + off, pitch, base, w, rw.send, s)
                } else {
                    cu::CUresult::CUDA_SUCCESS
                }
            }
        };
        let job = |k: usize| -> crate::staged::Job {
            let (w, base) = (width(k), base_of(k));
            let cd = CollDesc { count: w / es, ..*d };
            let (sw, rwb, with_send) = (rw.send * w, rw.recv * w, !in_place && rw.send > 0);
            Box::new(move |c: &Communicator| {
                // SAFETY: the slot is pinned memory of at least sw + rwb bytes that outlives
                // the stream work using it (DeviceComm frees slots only after their last
                // event); between this chunk's trigger (after its downloads) and its
                // completion (before its uploads) nothing else touches it.
                let area = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, sw + rwb) };
                let (sa, ra) = area.split_at_mut(sw);
                c.coll(cd, if with_send { Some(sa) } else { None }, ra)
            })
        };
        let mut epochs = Vec::with_capacity(chunks);
        let wait_and_upload = |k: usize, (signal, epoch): (&'static StreamSignal, u64)| -> Result<()> {
            signal.wait_on(stream, epoch, bound)?;
            let w = width(k);
            if rw.recv > 0 && w > 0 {
                let p = (base_of(k) + rw.send * w) as *mut u8;
                // SAFETY: the receive rows lie inside the caller's receive buffer; the slot
                // stays allocated until the event recorded after this call completed.
                let rc = unsafe { copy_rows(false, recv + (k * per * es) as u64, pitch, p, w, rw.recv, s) };
                ck("host to device", rc)?;
            }
            Ok(())
        };
        for k in 0..chunks {
            ck("device to host", download(k))?;
            let lane = k % lanes;
            let (signal, epoch) = self.progress[lane].submit(indices[lane], job(k));
            signal.trigger_on(stream, epoch)?;
            epochs.push((signal, epoch));
            if k >= ahead {
                wait_and_upload(k - ahead, epochs[k - ahead])?;
            }
        }
        let last = chunks.saturating_sub(ahead);
        for (k, &signalled) in epochs.iter().enumerate().skip(last) {
            wait_and_upload(k, signalled)?;
        }
        let after = Arc::new(q.record()?);
        for slot in &mut self.slots {
            slot.uploaded = Some(after.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sucl_core::{DType, ReduceOp};

    #[test]
    fn staged_lanes_come_from_the_environment_and_are_checked() {
        let lanes = |v: Option<&str>| staged_lanes(&|k| if k == "SUCL_STAGED_LANES" { v.map(str::to_string) } else { None });
        assert_eq!(lanes(None), Ok(DEFAULT_STAGED_LANES));
        assert_eq!(lanes(Some(" 1 ")), Ok(1));
        assert_eq!(lanes(Some("8")), Ok(MAX_STAGED_LANES));
        for bad in ["0", "9", "two", "-1", ""] {
            let e = lanes(Some(bad)).unwrap_err();
            assert!(e.contains("SUCL_STAGED_LANES") && e.contains("1 to 8"), "{bad}: {e}");
        }
    }

    /// The staged path's row plan must move exactly the buffers the op defines on every rank,
    /// and fit the slots sized from `max_rows` (which every rank computes alike).
    #[test]
    fn staged_rows_cover_each_ranks_buffers_and_fit_the_slots() {
        for n in [1usize, 2, 3, 4, 8] {
            for op in CollOp::ALL {
                for root in [0, n - 1] {
                    for r in 0..n {
                        let c = 5;
                        let d = CollDesc { op, dtype: DType::F32, redop: ReduceOp::Sum, root, count: c };
                        let (send_len, recv_len) = d.buffer_lens(n, r);
                        let rw = rows(&d, n, r);
                        let what = format!("{} n={n} rank={r} root={root}", op.name());
                        assert_eq!(rw.recv * c, recv_len, "receive rows of {what}");
                        let downloaded = (rw.send + rw.in_place_row.is_some() as usize) * c;
                        let source = if op == CollOp::Broadcast {
                            if r == root {
                                c
                            } else {
                                0
                            }
                        } else {
                            send_len
                        };
                        assert_eq!(downloaded, source, "downloaded elements of {what}");
                        assert!(rw.send + rw.recv <= max_rows(op, n), "slot rows of {what}");
                        if let Some(row) = rw.in_place_row {
                            assert!(row < rw.recv, "in-place row of {what}");
                        }
                    }
                }
            }
        }
    }
}
