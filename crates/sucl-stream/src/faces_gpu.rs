//! Faces on CUDA GPUs (feature `cuda`): the same geometry as [`crate::faces`], with pack,
//! interior and unpack as NVRTC-compiled kernels that gather and scatter through index maps
//! built on the host by [`Grid`]. Two variants:
//! - baseline (NCCL): pack, host synchronize, the 26 sends and receives as one NCCL group,
//!   interior, host synchronize (wait all), unpack;
//! - stream-triggered (NCCL or staged): pack, enqueue the receives and sends, start, interior,
//!   wait, unpack — the host synchronizes only at the end of a pass.
//!
//! Both are checked against the host reference (relative difference < 1e-15).

use crate::device::{DeviceBuf, Transport};
use crate::faces::{max_rel_diff, Grid, Outcome, DIRS};
use crate::{CommQueue, PROC_NULL};
use std::time::{Duration, Instant};
use sucl_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use sucl_runtime::cuda::{Buffer, Kernel, Queue};
use sucl_runtime::{Communicator, Result};

const SRC: &str = r#"
extern "C" __global__ void faces_pack(const double* u, const int* src, double* out, int len) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < len; c += gridDim.x * blockDim.x) {
        double s = 0.0;
        for (int k = 0; k < 4; k++) { int i = src[4 * c + k]; if (i >= 0) s += u[i]; }
        out[c] = s;
    }
}
extern "C" __global__ void faces_pairs(double* u, const int* p, int pairs) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < pairs; c += gridDim.x * blockDim.x) {
        int a = p[2 * c], b = p[2 * c + 1];
        double s = u[a] + u[b];
        u[a] = s; u[b] = s;
    }
}
extern "C" __global__ void faces_unpack(double* u, const int* dst, const double* got, int len) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < len; c += gridDim.x * blockDim.x)
        u[dst[c]] += got[c];
}
"#;

fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(256).clamp(1, 2048), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn launch_err(rank: usize, e: sucl_cuda::cudarc::driver::DriverError) -> sucl_runtime::Error {
    sucl_cuda::cuda_err(rank, "launching a faces kernel", e)
}

/// The device side of one rank: kernels, index maps, buffers.
struct Dev {
    pack: Kernel,
    pairs: Kernel,
    unpack: Kernel,
    src: Vec<Buffer<i32>>,
    dst: Vec<Buffer<i32>>,
    inner: Vec<Buffer<i32>>,
    u: DeviceBuf<f64>,
    sends: Vec<DeviceBuf<f64>>,
    recvs: Vec<DeviceBuf<f64>>,
    rank: usize,
}

impl Dev {
    fn new(g: &Grid, q: &Queue, rank: usize) -> Result<Dev> {
        let dev = q.device();
        let lens: Vec<usize> = (0..DIRS.len()).map(|d| g.message_len(d)).collect();
        Ok(Dev {
            pack: Kernel::compile(dev, SRC, "faces_pack")?,
            pairs: Kernel::compile(dev, SRC, "faces_pairs")?,
            unpack: Kernel::compile(dev, SRC, "faces_unpack")?,
            src: (0..26).map(|d| q.upload(&g.pack_sources(d))).collect::<Result<_>>()?,
            dst: (0..26).map(|d| q.upload(&g.unpack_targets(d))).collect::<Result<_>>()?,
            inner: (0..3).map(|a| q.upload(&g.interior_pairs(a))).collect::<Result<_>>()?,
            u: DeviceBuf::new(q.alloc::<f64>(g.points())?),
            sends: lens.iter().map(|&l| q.alloc::<f64>(l).map(DeviceBuf::new)).collect::<Result<_>>()?,
            recvs: lens.iter().map(|&l| q.alloc::<f64>(l).map(DeviceBuf::new)).collect::<Result<_>>()?,
            rank,
        })
    }

    fn init(&self, g: &Grid) -> Result<()> {
        let mut h = vec![0.0; g.points()];
        g.init(&mut h);
        self.u.lock().copy_from_host(&h)
    }

    fn pack(&self, g: &Grid, q: &Queue) -> Result<()> {
        let u = self.u.lock();
        for d in 0..26 {
            if g.peers[d] == PROC_NULL {
                continue;
            }
            let mut out = self.sends[d].lock();
            let len = out.len() as i32;
            let mut l = q.stream().launch_builder(self.pack.function());
            l.arg(u.cuda_slice().expect("points"))
                .arg(self.src[d].cuda_slice().expect("map"))
                .arg(out.cuda_slice_mut().expect("message"))
                .arg(&len);
            // SAFETY: the arguments match faces_pack; the maps index inside `u` and `out`.
            unsafe { l.launch(cfg(len as usize)) }.map_err(|e| launch_err(self.rank, e))?;
        }
        Ok(())
    }

    fn interior(&self, q: &Queue) -> Result<()> {
        let mut u = self.u.lock();
        for p in &self.inner {
            let pairs = (p.len() / 2) as i32;
            if pairs == 0 {
                continue;
            }
            let mut l = q.stream().launch_builder(self.pairs.function());
            l.arg(u.cuda_slice_mut().expect("points")).arg(p.cuda_slice().expect("pairs")).arg(&pairs);
            // SAFETY: as for pack; the pairs of one pass are disjoint.
            unsafe { l.launch(cfg(pairs as usize)) }.map_err(|e| launch_err(self.rank, e))?;
        }
        Ok(())
    }

    fn unpack(&self, g: &Grid, q: &Queue) -> Result<()> {
        let mut u = self.u.lock();
        for d in 0..26 {
            if g.peers[d] == PROC_NULL {
                continue;
            }
            let got = self.recvs[d].lock();
            let len = got.len() as i32;
            let mut l = q.stream().launch_builder(self.unpack.function());
            l.arg(u.cuda_slice_mut().expect("points"))
                .arg(self.dst[d].cuda_slice().expect("map"))
                .arg(got.cuda_slice().expect("message"))
                .arg(&len);
            // SAFETY: as for pack; one message's targets are distinct, and messages unpack one
            // after another in stream order.
            unsafe { l.launch(cfg(len as usize)) }.map_err(|e| launch_err(self.rank, e))?;
        }
        Ok(())
    }

    fn check(&self, g: &Grid) -> Result<f64> {
        let got = self.u.lock().to_vec()?;
        Ok(max_rel_diff(&got, &g.reference(g.input().ni)))
    }
}

/// Addresses of device buffers for a direct NCCL group.
fn addrs(bufs: &[DeviceBuf<f64>], peers: &[usize; 26], q: &Queue, write: bool) -> Vec<(u64, usize, usize)> {
    use sucl_cuda::{DeviceMemory, DeviceMemoryMut};
    bufs.iter()
        .zip(peers)
        .filter(|(_, &p)| p != PROC_NULL)
        .map(|(b, &p)| {
            let mut g = b.lock();
            let a = if write { DeviceMemoryMut::write_ptr(&mut *g, q.stream()).0 } else { DeviceMemory::read_ptr(&*g, q.stream()).0 };
            (a, b.len() * 8, p)
        })
        .collect()
}

/// Host copies of the messages for the baseline without NCCL.
struct Staging {
    sends: Vec<Vec<f64>>,
    recvs: Vec<Vec<f64>>,
}

impl Staging {
    fn new(dev: &Dev) -> Staging {
        let zeros = |bufs: &[DeviceBuf<f64>]| bufs.iter().map(|b| vec![0.0; b.len()]).collect();
        Staging { sends: zeros(&dev.sends), recvs: zeros(&dev.recvs) }
    }

    /// After pack and a synchronize: downloads the sends, starts the interior kernel, exchanges
    /// on the host (tag 1, as the stream-triggered variant) and uploads what arrived, enqueued
    /// before the caller's unpack. Returns the time spent waiting for the receives.
    fn exchange(&mut self, comm: &Communicator, g: &Grid, dev: &Dev, q: &Queue) -> Result<Duration> {
        let live = |d: &usize| g.peers[*d] != PROC_NULL;
        for d in (0..g.peers.len()).filter(live) {
            self.sends[d] = dev.sends[d].lock().to_vec()?;
        }
        dev.interior(q)?;
        let (sends, recvs) = (&self.sends, &mut self.recvs);
        let waited = comm.nonblocking(|sc| {
            let mut rq = vec![];
            for (d, r) in recvs.iter_mut().enumerate().filter(|(d, _)| live(d)) {
                rq.push(sc.irecv(r, g.peers[d], 1)?);
            }
            for (d, s) in sends.iter().enumerate().filter(|(d, _)| live(d)) {
                sc.isend(s, g.peers[d], 1)?;
            }
            let t = Instant::now();
            for r in rq {
                r.wait()?;
            }
            Ok(t.elapsed())
        })?;
        for d in (0..g.peers.len()).filter(live) {
            dev.recvs[d].lock().copy_from_host(&self.recvs[d])?;
        }
        Ok(waited)
    }
}

/// The baseline: pack, synchronize, exchange, interior, wait, unpack. Over NCCL (one group of
/// sends and receives on the stream) where the communicator set NCCL up; otherwise as a program
/// without NCCL writes it: the packed messages downloaded, host `isend`/`irecv`, the interior
/// kernel running meanwhile, the received messages uploaded. The communicator must have its
/// device side on `q`'s GPU (`attach_device`).
pub fn run_baseline(comm: &Communicator, g: &Grid, q: &Queue) -> Result<Outcome> {
    let dev = Dev::new(g, q, comm.rank())?;
    let nccl = comm.device_backends().contains(&"nccl");
    let (sends, recvs) = (addrs(&dev.sends, &g.peers, q, false), addrs(&dev.recvs, &g.peers, q, true));
    let mut staged = Staging::new(&dev);
    let inp = g.input();
    let (mut timed, mut steps, mut worst, mut blocked) = (0.0, 0usize, 0.0f64, 0.0);
    for _k in 0..inp.nk {
        for j in 0..=inp.nj {
            dev.init(g)?;
            comm.synchronize(q)?;
            comm.barrier()?;
            let t0 = Instant::now();
            let mut waited = Duration::ZERO;
            let mut host_wait = Duration::ZERO;
            let mut sync = || -> Result<()> {
                let t = Instant::now();
                comm.synchronize(q)?;
                waited += t.elapsed();
                Ok(())
            };
            for _ in 0..inp.ni {
                dev.pack(g, q)?;
                sync()?;
                if nccl {
                    // SAFETY: the buffers live in `dev` until the stream is synchronized below.
                    unsafe { comm.nccl_group_p2p(&sends, &recvs, q)? };
                    dev.interior(q)?;
                } else {
                    host_wait += staged.exchange(comm, g, &dev, q)?;
                }
                sync()?;
                dev.unpack(g, q)?;
            }
            sync()?;
            if j > 0 {
                timed += t0.elapsed().as_secs_f64();
                blocked += (waited + host_wait).as_secs_f64();
                steps += inp.ni;
            }
            worst = worst.max(dev.check(g)?);
        }
    }
    let per = steps.max(1) as f64;
    Ok(Outcome { per_step: timed / per, max_diff: worst, blocked: blocked / per })
}

/// The stream-triggered variant over `transport`.
pub fn run_triggered(comm: Communicator, g: &Grid, q: &Queue, transport: Transport) -> Result<(Outcome, Communicator)> {
    let dev = Dev::new(g, q, comm.rank())?;
    let ctl = comm.split(Some(0), comm.rank() as i64)?.ok_or_else(|| sucl_runtime::Error::Config("faces: split".into()))?;
    let mut cq = CommQueue::on_stream(comm, q, transport)?;
    let inp = g.input();
    let (mut timed, mut steps, mut worst, mut blocked) = (0.0, 0usize, 0.0f64, 0.0);
    for _k in 0..inp.nk {
        for j in 0..=inp.nj {
            dev.init(g)?;
            cq.synchronize()?;
            ctl.barrier()?;
            let t0 = Instant::now();
            let b0 = cq.host_blocked();
            for _ in 0..inp.ni {
                dev.pack(g, q)?;
                for (r, &p) in dev.recvs.iter().zip(&g.peers) {
                    cq.enqueue_recv(r, p, 1)?;
                }
                for (s, &p) in dev.sends.iter().zip(&g.peers) {
                    cq.enqueue_send(s, p, 1)?;
                }
                cq.start()?;
                dev.interior(q)?;
                cq.wait()?;
                dev.unpack(g, q)?;
            }
            cq.synchronize()?;
            if j > 0 {
                timed += t0.elapsed().as_secs_f64();
                blocked += (cq.host_blocked() - b0).as_secs_f64();
                steps += inp.ni;
            }
            worst = worst.max(dev.check(g)?);
        }
    }
    drop(ctl);
    let comm = cq.close()?;
    let per = steps.max(1) as f64;
    Ok((Outcome { per_step: timed / per, max_diff: worst, blocked: blocked / per }, comm))
}
