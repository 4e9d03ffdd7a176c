//! CUDA devices in the daemon, through sucl-cuda's device layer: buffers in device memory, one
//! in-order stream per device (every queue of every session on that GPU runs on it), kernels
//! compiled from CUDA C by NVRTC per session. Compiled and type-checked here; it runs only on a
//! machine with a GPU (see `scripts/remote-gpu-check.sh`).

use crate::wire::failed;
use crate::wire::{code, Arg, DeviceInfo, DeviceKind, Outcome};
use std::ops::Range;
use sucl_cuda::cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use sucl_cuda::{Buffer, Device, Event, Kernel, Queue};

/// One GPU and the stream the daemon runs its work on.
pub(crate) struct CudaServed {
    dev: Device,
    queue: Queue,
}

/// A CUDA buffer of bytes.
pub(crate) struct CudaMem(Buffer<u8>);

/// A recorded CUDA event.
pub(crate) type CudaEv = Event;

/// A kernel argument as the launch passes it.
pub(crate) enum LaunchArg {
    Ptr(u64),
    Scalar(Arg),
}

fn dev_err(during: &str, e: impl std::fmt::Display) -> Outcome {
    failed(code::DEVICE, format!("{during}: {e}"))
}

/// Every GPU of this machine, or why there are none.
pub(crate) fn open_all() -> Result<Vec<CudaServed>, String> {
    let n = sucl_cuda::probe()?;
    (0..n)
        .map(|i| {
            let dev = Device::open(i).map_err(|e| e.to_string())?;
            let queue = dev.queue().map_err(|e| e.to_string())?;
            Ok(CudaServed { dev, queue })
        })
        .collect()
}

/// Waits for a CUDA event.
pub(crate) fn sync_event(e: &Event) -> Result<(), Outcome> {
    e.synchronize().map_err(|e| dev_err("waiting for an event", e))
}

impl CudaServed {
    pub(crate) fn info(&self) -> DeviceInfo {
        DeviceInfo { kind: DeviceKind::Cuda, name: self.dev.name(), memory: self.dev.total_memory() as u64 }
    }

    pub(crate) fn alloc(&self, len: usize) -> Result<CudaMem, Outcome> {
        self.queue.alloc::<u8>(len).map(CudaMem).map_err(|e| dev_err("allocating device memory", e))
    }

    pub(crate) fn compile(&self, name: &str, source: &str) -> Result<Kernel, Outcome> {
        Kernel::compile(&self.dev, source, name).map_err(|e| failed(code::KERNEL, e.to_string()))
    }

    pub(crate) fn record(&self) -> Result<Event, Outcome> {
        self.queue.record().map_err(|e| dev_err("recording an event", e))
    }

    pub(crate) fn wait_for(&self, e: &Event) -> Result<(), Outcome> {
        self.queue.wait_for(e).map_err(|e| dev_err("waiting for an event", e))
    }

    pub(crate) fn synchronize(&self) -> Result<(), Outcome> {
        self.queue.synchronize().map_err(|e| dev_err("synchronizing", e))
    }

    /// Launches `kernel` over `range` threads (blocks of 256) with `args` in order: buffers as
    /// device pointers, integers as 64-bit, floats as their own width.
    pub(crate) fn launch(&self, kernel: &Kernel, args: &[LaunchArg], range: u64) -> Result<(), Outcome> {
        let blocks = range.div_ceil(256).clamp(1, u32::MAX as u64) as u32;
        // The values must outlive the builder, which keeps pointers to them.
        let (mut words, mut floats) = (Vec::with_capacity(args.len()), Vec::with_capacity(args.len()));
        for a in args {
            match a {
                LaunchArg::Ptr(p) => words.push(*p),
                LaunchArg::Scalar(Arg::U64(v)) => words.push(*v),
                LaunchArg::Scalar(Arg::I64(v)) => words.push(*v as u64),
                LaunchArg::Scalar(Arg::F64(v)) => words.push(v.to_bits()),
                LaunchArg::Scalar(Arg::F32(v)) => floats.push(*v),
                LaunchArg::Scalar(Arg::Buffer(_)) => unreachable!("buffers are resolved to pointers"),
            }
        }
        let stream = self.queue.stream();
        let mut b = stream.launch_builder(kernel.function());
        let (mut wi, mut fi) = (0, 0);
        for a in args {
            match a {
                LaunchArg::Scalar(Arg::F32(_)) => {
                    b.arg(&floats[fi]);
                    fi += 1;
                }
                _ => {
                    b.arg(&words[wi]);
                    wi += 1;
                }
            }
        }
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the client names the kernel's parameters; each is passed as a 64-bit word (a
        // device pointer of a live buffer of this session, or an integer/double) or a 32-bit
        // float. A kernel whose signature disagrees reads wrong values but no host memory.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| dev_err("launching", format!("{e:?}")))
    }
}

impl CudaMem {
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    fn slice(&self) -> Result<&sucl_cuda::cudarc::driver::CudaSlice<u8>, Outcome> {
        self.0.cuda_slice().ok_or_else(|| failed(code::INVALID, "the buffer is empty"))
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        match self.0.cuda_slice() {
            Some(s) => {
                let (p, _sync) = s.device_ptr(self.0.queue().stream());
                p
            }
            None => 0,
        }
    }

    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), Outcome> {
        if data.is_empty() {
            return Ok(());
        }
        let stream = self.0.queue().stream().clone();
        let s = self.0.cuda_slice_mut().ok_or_else(|| failed(code::INVALID, "the buffer is empty"))?;
        stream.memcpy_htod(data, &mut s.slice_mut(offset..offset + data.len())).map_err(|e| dev_err("writing", format!("{e:?}")))
    }

    pub(crate) fn read(&self, r: Range<usize>) -> Result<Vec<u8>, Outcome> {
        if r.is_empty() {
            return Ok(Vec::new());
        }
        let stream = self.0.queue().stream();
        let v = stream.clone_dtoh(&self.slice()?.slice(r)).map_err(|e| dev_err("reading", format!("{e:?}")))?;
        self.0.queue().synchronize().map_err(|e| dev_err("reading", e))?;
        Ok(v)
    }

    /// Reads bytes `r` into `out` (of the same length), without allocating.
    pub(crate) fn read_into(&self, r: Range<usize>, out: &mut [u8]) -> Result<(), Outcome> {
        if r.is_empty() {
            return Ok(());
        }
        let stream = self.0.queue().stream();
        stream.memcpy_dtoh(&self.slice()?.slice(r), out).map_err(|e| dev_err("reading", format!("{e:?}")))?;
        self.0.queue().synchronize().map_err(|e| dev_err("reading", e))
    }

    pub(crate) fn fill(&mut self, r: Range<usize>, pattern: &[u8]) -> Result<(), Outcome> {
        let host: Vec<u8> = pattern.iter().copied().cycle().take(r.len()).collect();
        self.write(r.start, &host)
    }

    pub(crate) fn copy_within(&mut self, r: Range<usize>, dst: usize) -> Result<(), Outcome> {
        // Device-to-device copies may not overlap; go through the host.
        let host = self.read(r)?;
        self.write(dst, &host)
    }

    pub(crate) fn copy_from(&mut self, src: &CudaMem, r: Range<usize>, dst: usize) -> Result<(), Outcome> {
        if r.is_empty() {
            return Ok(());
        }
        let stream = self.0.queue().stream().clone();
        let n = r.len();
        let from = src.slice()?.slice(r);
        let s = self.0.cuda_slice_mut().ok_or_else(|| failed(code::INVALID, "the buffer is empty"))?;
        stream.memcpy_dtod(&from, &mut s.slice_mut(dst..dst + n)).map_err(|e| dev_err("copying", format!("{e:?}")))
    }
}
