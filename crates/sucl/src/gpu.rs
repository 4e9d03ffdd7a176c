//! Device memory through the same communicator (feature `cuda`): [`Communicator::cuda`] gives a
//! [`GpuComm`] whose collectives take CUDA buffers and run over NCCL (enqueued on the GPU
//! stream, no host synchronization) or staged through pinned host memory and the
//! communicator's host backend, chosen per op and size.

use crate::{Communicator, Element, Error, ReduceOp, Result};
use std::cell::{Cell, RefCell};
use sucl_core::backend::{CollDesc, CollOp};
use sucl_cuda::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, PinnedHostSlice};
use sucl_cuda::{DeviceBackend, GpuDevice, NcclBackend};

pub use sucl_cuda::{driver_version, nccl_version, probe};

/// Bytes per stage of the pipelined staged path.
const STAGE_CHUNK: usize = 4 << 20;

/// Collectives on CUDA buffers for one communicator (see the module documentation).
pub struct GpuComm<'c> {
    comm: &'c Communicator,
    dev: GpuDevice,
    out_stream: std::sync::Arc<CudaStream>,
    nccl: RefCell<Option<NcclBackend>>,
    pinned: RefCell<Vec<PinnedHostSlice<u8>>>,
    forced: Cell<Option<&'static str>>,
    threshold: i64,
}

impl Communicator {
    /// Opens CUDA device `ordinal` (default: local rank modulo the device count) and sets up
    /// NCCL when every rank can load it. Collective.
    pub fn cuda(&self, ordinal: Option<usize>) -> Result<GpuComm<'_>> {
        let wr = self.wr();
        let n = probe().map_err(|why| Error::BackendUnavailable { rank: wr, backend: "cuda".into(), why })?;
        let dev = GpuDevice::open(ordinal.unwrap_or(self.local_rank() % n), wr)?;
        let store = self.ctx.store.as_ref().ok_or_else(|| Error::Config("no rendezvous store".into()))?;
        let k = self.splits.get() + 1;
        self.splits.set(k);
        let key = format!("{}/gpu{k}", self.prefix);
        let mine = nccl_version().is_ok();
        store.set(&format!("{key}/nccl/{}", self.rank), if mine { b"1" } else { b"0" })?;
        let mut all = true;
        for r in 0..self.size {
            all &= store.get(&format!("{key}/nccl/{r}"))? == b"1";
        }
        let nccl = if all {
            let id = if self.rank == 0 {
                let id = sucl_cuda::nccl_unique_id().map_err(|why| Error::BackendUnavailable { rank: wr, backend: "nccl".into(), why })?;
                store.set(&format!("{key}/nccl-id"), &id)?;
                id
            } else {
                store.get(&format!("{key}/nccl-id"))?
            };
            let h = &self.ctx.cfg.host;
            Some(NcclBackend::new(&dev, &id, self.rank, self.size, wr, self.ctx.abort.clone(), h.timeout, h.backoff)?)
        } else {
            tracing::info!(rank = wr, "NCCL is not loadable on every rank; device calls are staged through host memory");
            None
        };
        let forced = match std::env::var("SUCL_GPU_BACKEND").ok().as_deref() {
            None | Some("auto") => None,
            Some("nccl") => Some("nccl"),
            Some("staged") => Some("staged"),
            Some(other) => return Err(Error::Config(format!("SUCL_GPU_BACKEND={other:?}: expected auto, nccl or staged"))),
        };
        let threshold = self.ctx.cfg.platforms.get("cuda").map(|p| p.threshold).unwrap_or(0);
        let out_stream = dev.ctx.new_stream().map_err(|e| sucl_cuda::cuda_err(wr, "creating the upload stream", e))?;
        Ok(GpuComm {
            comm: self,
            dev,
            out_stream,
            nccl: RefCell::new(nccl),
            pinned: RefCell::new(vec![]),
            forced: Cell::new(forced),
            threshold,
        })
    }
}

impl<'c> GpuComm<'c> {
    /// The stream communication is ordered on: launch kernels on it, or make other streams
    /// wait for it.
    pub fn stream(&self) -> &std::sync::Arc<CudaStream> {
        &self.dev.stream
    }

    /// The device.
    pub fn device(&self) -> &GpuDevice {
        &self.dev
    }

    /// The device backends usable by every rank.
    pub fn backends(&self) -> Vec<&'static str> {
        if self.nccl.borrow().is_some() {
            vec!["nccl", "staged"]
        } else {
            vec!["staged"]
        }
    }

    /// Sends every later device call to `name` (`nccl`, `staged`) or back to selection (None).
    pub fn pin_backend(&self, name: Option<&str>) -> Result<()> {
        match name {
            None => self.forced.set(None),
            Some("staged") => self.forced.set(Some("staged")),
            Some("nccl") if self.nccl.borrow().is_some() => self.forced.set(Some("nccl")),
            Some(n) => {
                return Err(Error::BackendUnavailable {
                    rank: self.comm.wr(),
                    backend: n.into(),
                    why: format!("not loaded (loaded: {:?})", self.backends()),
                })
            }
        }
        Ok(())
    }

    /// The device backend a call of `op` on `bytes` bytes would use: the tuning table's rules for
    /// `nccl`/`staged`, then the `cuda` platform threshold (below it staged), else NCCL.
    pub fn backend_for(&self, op: CollOp, bytes: usize) -> &'static str {
        if let Some(f) = self.forced.get() {
            return f;
        }
        if self.nccl.borrow().is_none() {
            return "staged";
        }
        let n = self.comm.size();
        for r in &self.comm.ctx.cfg.tuning {
            let op_ok = r.op.as_deref().is_none_or(|o| o == op.name());
            if op_ok && r.ranks.0 <= n && n <= r.ranks.1 && r.bytes.0 <= bytes as u64 && (bytes as u64) < r.bytes.1 {
                match r.backend.as_str() {
                    "nccl" => return "nccl",
                    "staged" => return "staged",
                    _ => {}
                }
            }
        }
        if self.threshold < 0 || (bytes as i128) < self.threshold as i128 {
            "staged"
        } else {
            "nccl"
        }
    }

    /// Waits (bounded) until all communication enqueued on [`GpuComm::stream`] completed.
    pub fn synchronize(&self) -> Result<()> {
        match self.nccl.borrow_mut().as_mut() {
            Some(n) => n.synchronize(&self.dev.stream),
            None => self.dev.stream.synchronize().map_err(|e| sucl_cuda::cuda_err(self.comm.wr(), "stream synchronize", e)),
        }
    }

    fn run(&self, d: CollDesc, send: Option<u64>, recv: u64) -> Result<()> {
        let bytes = crate::select::selection_bytes(&d, self.comm.size()) as usize;
        let which = self.backend_for(d.op, bytes);
        tracing::debug!(op = d.op.name(), count = d.count, backend = which, "device collective");
        if which == "nccl" {
            if let Some(n) = self.nccl.borrow_mut().as_mut() {
                return n.collective(&d, send, recv, &self.dev.stream);
            }
        }
        self.staged(&d, send, recv)
    }

    /// Device → pinned host → the communicator's host backend → device. Element-wise ops move
    /// in chunks so that device copies overlap the host collective of the previous chunk.
    fn staged(&self, d: &CollDesc, send: Option<u64>, recv: u64) -> Result<()> {
        use sucl_cuda::cudarc::driver::result as dr;
        let (n, r, es) = (self.comm.size(), self.comm.rank(), d.dtype.size());
        let wr = self.comm.wr();
        let cuda = |during: &'static str| move |e| sucl_cuda::cuda_err(wr, during, e);
        let s = self.dev.stream.cu_stream();
        let (send_len, recv_len) = staged_lens(d, n, r);
        self.dev.stream.synchronize().map_err(cuda("ordering after earlier work"))?;
        let chunked = matches!(d.op, CollOp::AllReduce | CollOp::Broadcast | CollOp::Reduce);
        let stage = if chunked { STAGE_CHUNK.min(recv_len.max(send_len)).max(es) / es * es } else { send_len.max(recv_len) };
        self.ensure_pinned(2, stage.max(send_len.max(recv_len).min(if chunked { stage } else { usize::MAX })).max(1))?;
        let mut pinned = self.pinned.borrow_mut();
        if !chunked {
            let (a, b) = pinned.split_at_mut(1);
            let inb = a[0].as_mut_slice().map_err(cuda("pinned buffer"))?;
            let outb = b[0].as_mut_slice().map_err(cuda("pinned buffer"))?;
            let src = send.unwrap_or(recv);
            // SAFETY: device pointers cover the lengths (validated by the typed API).
            unsafe {
                if send_len > 0 {
                    dr::memcpy_dtoh_async(&mut inb[..send_len], src, s).map_err(cuda("device to host"))?;
                }
                if send.is_none() && recv_len > 0 {
                    dr::memcpy_dtoh_async(&mut outb[..recv_len], recv, s).map_err(cuda("device to host"))?;
                }
            }
            self.dev.stream.synchronize().map_err(cuda("device to host"))?;
            let host_send = send.map(|_| &inb[..send_len]);
            self.comm.coll(*d, host_send, &mut outb[..recv_len])?;
            if recv_len > 0 {
                // SAFETY: as above.
                unsafe { dr::memcpy_htod_async(recv, &outb[..recv_len], s).map_err(cuda("host to device"))? };
            }
            return self.dev.stream.synchronize().map_err(cuda("host to device"));
        }
        // Pipelined element-wise path: chunk k of the message is an independent collective.
        // Downloads run on the main stream, uploads on a second one, so that chunk k's upload,
        // chunk k+1's download and the host collective of chunk k+1 overlap; events keep a
        // pinned buffer from being refilled while its previous upload still reads it.
        let total = d.count;
        let per = stage / es;
        let chunks = total.div_ceil(per.max(1)).max(1);
        let is_root = d.op != CollOp::Reduce || r == d.root;
        let downloads = d.op != CollOp::Broadcast || r == d.root;
        let src_of = |k: usize| send.unwrap_or(recv) + (k * per * es) as u64;
        let len_of = |k: usize| (total - k * per).min(per) * es;
        let sout = &self.out_stream;
        let mut uploaded: [Option<CudaEvent>; 2] = [None, None];
        let copy_in = |k: usize, buf: &mut [u8]| -> Result<()> {
            let len = len_of(k);
            if downloads && len > 0 {
                // SAFETY: chunk k lies inside the device buffer.
                unsafe { dr::memcpy_dtoh_async(&mut buf[..len], src_of(k), s).map_err(cuda("device to host"))? };
            }
            Ok(())
        };
        copy_in(0, pinned[0].as_mut_slice().map_err(cuda("pinned buffer"))?)?;
        for k in 0..chunks {
            let b = k % 2;
            self.dev.stream.synchronize().map_err(cuda("staging"))?;
            if k + 1 < chunks {
                let nb = (k + 1) % 2;
                if let Some(ev) = &uploaded[nb] {
                    self.dev.stream.wait(ev).map_err(cuda("ordering a download after an upload"))?;
                }
                copy_in(k + 1, pinned[nb].as_mut_slice().map_err(cuda("pinned buffer"))?)?;
            }
            if let Some(ev) = uploaded[b].take() {
                // Ranks that download nothing (broadcast receivers) reuse the buffer directly.
                ev.synchronize().map_err(cuda("waiting for an upload"))?;
            }
            let len = len_of(k);
            let buf = pinned[b].as_mut_slice().map_err(cuda("pinned buffer"))?;
            let cd = CollDesc { count: len / es, ..*d };
            match d.op {
                CollOp::Reduce if !is_root => self.comm.coll(cd, Some(&buf[..len]), &mut [])?,
                _ => self.comm.coll(cd, None, &mut buf[..len])?,
            }
            if is_root && len > 0 {
                // SAFETY: chunk k of the receive buffer.
                unsafe {
                    dr::memcpy_htod_async(recv + (k * per * es) as u64, &buf[..len], sout.cu_stream()).map_err(cuda("host to device"))?
                };
                uploaded[b] = Some(sout.record_event(None).map_err(cuda("recording an upload"))?);
            }
        }
        sout.synchronize().map_err(cuda("host to device"))
    }

    fn ensure_pinned(&self, count: usize, bytes: usize) -> Result<()> {
        let mut p = self.pinned.borrow_mut();
        if p.len() == count && p.iter().all(|b| b.len() >= bytes) {
            return Ok(());
        }
        p.clear();
        for _ in 0..count {
            // SAFETY: pinned host memory of `bytes` u8s; u8 has no invalid bit patterns.
            let b = unsafe { self.dev.ctx.alloc_pinned::<u8>(bytes) }
                .map_err(|e| sucl_cuda::cuda_err(self.comm.wr(), "allocating pinned memory", e))?;
            p.push(b);
        }
        Ok(())
    }

    fn ptrs<T: DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>) -> (u64, u64) {
        let (sp, _g1) = send.device_ptr(&self.dev.stream);
        let (rp, _g2) = recv.device_ptr_mut(&self.dev.stream);
        (sp, rp)
    }

    fn check_len(&self, arg: &'static str, got: usize, want: usize, what: &str) -> Result<()> {
        if got != want {
            return Err(Error::invalid(self.comm.wr(), arg, format!("has {got} elements but {what} needs {want}")));
        }
        Ok(())
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.comm.size() {
            return Err(Error::invalid(
                self.comm.wr(),
                "root",
                format!("rank {root} out of range (communicator size {})", self.comm.size()),
            ));
        }
        Ok(())
    }

    /// `recv = reduce(op, every rank's send)`, enqueued on the stream.
    pub fn all_reduce<T: Element + DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: ReduceOp) -> Result<()> {
        self.check_len("recv", recv.len(), send.len(), "all_reduce (same as send)")?;
        let (s, r) = self.ptrs(send, recv);
        self.run(desc::<T>(CollOp::AllReduce, send.len(), op, 0), Some(s), r)
    }

    /// In-place all_reduce.
    pub fn all_reduce_in_place<T: Element + DeviceRepr>(&self, buf: &mut CudaSlice<T>, op: ReduceOp) -> Result<()> {
        let n = buf.len();
        let (p, _g) = buf.device_ptr_mut(&self.dev.stream);
        self.run(desc::<T>(CollOp::AllReduce, n, op, 0), None, p)
    }

    /// Root's `buf` to every rank.
    pub fn broadcast<T: Element + DeviceRepr>(&self, buf: &mut CudaSlice<T>, root: usize) -> Result<()> {
        self.check_root(root)?;
        let n = buf.len();
        let (p, _g) = buf.device_ptr_mut(&self.dev.stream);
        self.run(desc::<T>(CollOp::Broadcast, n, ReduceOp::Sum, root), None, p)
    }

    /// Every rank's `send` reduced into root's `recv` (other ranks' `recv` is not touched).
    pub fn reduce<T: Element + DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: ReduceOp, root: usize) -> Result<()> {
        self.check_root(root)?;
        if self.comm.rank() == root {
            self.check_len("recv", recv.len(), send.len(), "reduce's root (same as send)")?;
        }
        let (s, r) = self.ptrs(send, recv);
        self.run(desc::<T>(CollOp::Reduce, send.len(), op, root), Some(s), r)
    }

    /// Every rank's `send` concatenated into every rank's `recv`.
    pub fn all_gather<T: Element + DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>) -> Result<()> {
        self.check_len("recv", recv.len(), send.len() * self.comm.size(), "all_gather (size × send)")?;
        let (s, r) = self.ptrs(send, recv);
        self.run(desc::<T>(CollOp::AllGather, send.len(), ReduceOp::Sum, 0), Some(s), r)
    }

    /// Reduce, then rank r keeps block r.
    pub fn reduce_scatter<T: Element + DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: ReduceOp) -> Result<()> {
        self.check_len("send", send.len(), recv.len() * self.comm.size(), "reduce_scatter (size × recv)")?;
        let (s, r) = self.ptrs(send, recv);
        self.run(desc::<T>(CollOp::ReduceScatter, recv.len(), op, 0), Some(s), r)
    }

    /// Every rank's `send` concatenated into root's `recv`.
    pub fn gather<T: Element + DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, root: usize) -> Result<()> {
        self.check_root(root)?;
        if self.comm.rank() == root {
            self.check_len("recv", recv.len(), send.len() * self.comm.size(), "gather's root (size × send)")?;
        }
        let (s, r) = self.ptrs(send, recv);
        self.run(desc::<T>(CollOp::Gather, send.len(), ReduceOp::Sum, root), Some(s), r)
    }

    /// Block j of root's `send` to rank j's `recv`.
    pub fn scatter<T: Element + DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, root: usize) -> Result<()> {
        self.check_root(root)?;
        if self.comm.rank() == root {
            self.check_len("send", send.len(), recv.len() * self.comm.size(), "scatter's root (size × recv)")?;
        }
        let (s, r) = self.ptrs(send, recv);
        self.run(desc::<T>(CollOp::Scatter, recv.len(), ReduceOp::Sum, root), Some(s), r)
    }

    /// Block j of every rank's `send` to block i of rank j's `recv`.
    pub fn all_to_all<T: Element + DeviceRepr>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>) -> Result<()> {
        self.check_len("recv", recv.len(), send.len(), "all_to_all (same as send)")?;
        if !send.len().is_multiple_of(self.comm.size()) {
            return Err(Error::invalid(self.comm.wr(), "send", "length is not a multiple of the communicator size"));
        }
        let (s, r) = self.ptrs(send, recv);
        self.run(desc::<T>(CollOp::AllToAll, send.len() / self.comm.size(), ReduceOp::Sum, 0), Some(s), r)
    }

    /// Orders every rank on the stream (and, synchronized, on the host).
    pub fn barrier(&self) -> Result<()> {
        if self.backend_for(CollOp::Barrier, 0) == "nccl" && self.nccl.borrow().is_some() {
            let mut scratch =
                self.dev.stream.alloc_zeros::<u8>(1).map_err(|e| sucl_cuda::cuda_err(self.comm.wr(), "barrier scratch", e))?;
            let (p, _g) = scratch.device_ptr_mut(&self.dev.stream);
            self.nccl.borrow_mut().as_mut().expect("nccl").collective(&CollDesc::BARRIER, None, p, &self.dev.stream)?;
            return self.synchronize();
        }
        self.synchronize()?;
        self.comm.barrier()
    }
}

fn desc<T: Element>(op: CollOp, count: usize, redop: ReduceOp, root: usize) -> CollDesc {
    CollDesc { op, dtype: T::DTYPE, redop, root, count }
}

/// Host byte lengths of the staged send and receive buffers on rank `r`.
fn staged_lens(d: &CollDesc, n: usize, r: usize) -> (usize, usize) {
    let (s, rv) = d.buffer_lens(n, r);
    (s * d.dtype.size(), rv * d.dtype.size())
}
