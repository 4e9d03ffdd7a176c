//! Device memory and streams sucl did not create: a C caller's `cudaStream_t` and device
//! pointers (or another library's). [`Device::borrowed_queue`] wraps a raw `CUstream` as a
//! [`Queue`] that never destroys it, and [`ForeignBuffer`] is a raw device address and a length
//! that sucl neither owns nor frees. Both implement what sucl's own streams and buffers do, so
//! every device path (NCCL, peer memory, staged) takes them unchanged, ordered on the caller's
//! stream as NCCL orders its calls.
//!
//! Before a foreign address is used, [`pointer_device`] asks the driver what it is
//! (`cuPointerGetAttributes`): host memory, or device memory of another GPU, is refused with a
//! message saying so, before anything moves.

use crate::device::{DeviceElement, DeviceMemory, DeviceMemoryMut, Queue};
use cudarc::driver::sys as cu;
use cudarc::driver::{CudaStream, SyncOnDrop};
use std::marker::PhantomData;
use std::sync::OnceLock;
use sucl_core::{Error, Result};

/// Whether the CUDA driver can be loaded here (asked once per process: the answer cannot
/// change while it runs), or why not. Every foreign-memory check asks this first, since a
/// driver call without the driver would fail inside cudarc's loader.
pub fn driver_available() -> std::result::Result<(), String> {
    static AVAILABLE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    AVAILABLE.get_or_init(|| crate::probe().map(|_| ())).clone()
}

/// `CUmemorytype` values (`cuPointerGetAttributes` writes 0 for memory CUDA does not know).
const MEMORY_HOST: u32 = 1;
const MEMORY_DEVICE: u32 = 2;
const MEMORY_ARRAY: u32 = 3;
const MEMORY_UNIFIED: u32 = 4;

/// Judges what the driver said of one address (`memory_type`, `ordinal`): the GPU it is device
/// memory of, or why it is not usable as device memory. Pure, so that every refusal's wording
/// is tested without a GPU.
pub(crate) fn judge(addr: u64, memory_type: u32, ordinal: i32) -> std::result::Result<usize, String> {
    match memory_type {
        MEMORY_DEVICE if ordinal >= 0 => Ok(ordinal as usize),
        MEMORY_DEVICE => Err(format!("{addr:#x} is device memory of no GPU the driver names (ordinal {ordinal})")),
        MEMORY_HOST => Err(format!(
            "{addr:#x} is host memory known to CUDA (page-locked, registered or HMM), not device memory: pass a device pointer"
        )),
        MEMORY_ARRAY => Err(format!("{addr:#x} is a CUDA array, not linear device memory")),
        MEMORY_UNIFIED => Err(format!("{addr:#x} is unified host memory, not device memory")),
        0 => Err(format!("{addr:#x} is not CUDA memory (host memory?): pass a device pointer")),
        other => Err(format!("{addr:#x} has a memory type ({other}) sucl does not know")),
    }
}

/// What the driver says of one address: (memory type, device ordinal), zero and -1 for memory
/// it does not know.
fn attributes(addr: u64) -> std::result::Result<(u32, i32), String> {
    let mut memory_type: u32 = 0;
    let mut ordinal: i32 = -1;
    let mut which =
        [cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL];
    let mut data = [&mut memory_type as *mut u32 as *mut std::ffi::c_void, &mut ordinal as *mut i32 as *mut std::ffi::c_void];
    // SAFETY: two attributes and two out-pointers to live locals of the sizes the driver writes
    // for them (an unsigned int, an int); the address is only looked up, never dereferenced.
    // Callers checked that the driver is loaded (`driver_available`).
    let rc = unsafe { cu::cuPointerGetAttributes(2, which.as_mut_ptr(), data.as_mut_ptr(), addr) };
    match rc {
        cu::CUresult::CUDA_SUCCESS => Ok((memory_type, ordinal)),
        other => Err(format!("cuPointerGetAttributes({addr:#x}): {other:?}")),
    }
}

/// The GPU whose device memory holds `bytes` bytes at `addr` (the argument named `arg`): its
/// first and last bytes must both be device memory of that GPU. An error saying what the memory
/// is otherwise (host memory, another GPU's), or that no driver is loaded. Nothing is read.
pub fn pointer_device(rank: usize, arg: &'static str, addr: u64, bytes: usize) -> Result<usize> {
    driver_available().map_err(|why| Error::BackendUnavailable { rank, backend: "cuda".into(), why })?;
    if addr == 0 {
        return Err(Error::invalid(rank, arg, "is NULL but must be device memory"));
    }
    let last = (bytes.max(1) as u64 - 1)
        .checked_add(addr)
        .ok_or_else(|| Error::invalid(rank, arg, format!("{addr:#x} + {bytes} bytes wraps around the address space")))?;
    let ask = |a: u64| -> Result<usize> {
        let (t, o) = attributes(a).map_err(|why| Error::BackendUnavailable { rank, backend: "cuda".into(), why })?;
        judge(a, t, o).map_err(|why| Error::invalid(rank, arg, why))
    };
    let first = ask(addr)?;
    if last != addr {
        let end = ask(last)
            .map_err(|_| Error::invalid(rank, arg, format!("{addr:#x} + {bytes} bytes runs past the device allocation it starts in")))?;
        if end != first {
            return Err(Error::invalid(rank, arg, format!("{addr:#x} + {bytes} bytes spans GPUs {first} and {end}")));
        }
    }
    Ok(first)
}

/// `len` elements of `T` in device memory sucl did not allocate (a C caller's device pointer),
/// used on a [`Queue`] — usually the caller's own stream, [`Device::borrowed_queue`]. sucl never
/// frees it; calls enqueue their work on the queue and the caller keeps the memory alive and
/// untouched until that work ran (NCCL's rule).
///
/// [`Device::borrowed_queue`]: crate::Device::borrowed_queue
pub struct ForeignBuffer<T: DeviceElement> {
    addr: u64,
    len: usize,
    queue: Queue,
    elem: PhantomData<T>,
}

impl<T: DeviceElement> ForeignBuffer<T> {
    /// Checks `len` elements at `addr` with the driver ([`pointer_device`]: device memory of
    /// `queue`'s GPU from the first to the last byte) and wraps them; `arg` names the buffer in
    /// errors. An empty buffer (`len == 0`) may be any address, NULL included.
    ///
    /// # Safety
    /// The caller guarantees that `addr` is valid device memory of `len` elements on `queue`'s
    /// device for as long as the buffer and the work enqueued with it on `queue` live, and that
    /// nothing else writes it (or, for a buffer written, reads it) unless ordered by that stream.
    pub unsafe fn new(queue: &Queue, arg: &'static str, addr: u64, len: usize) -> Result<Self> {
        let rank = queue.device().rank();
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::invalid(rank, arg, format!("{len} elements of {} do not fit in memory", T::DTYPE)))?;
        if len == 0 {
            // SAFETY: an empty buffer is never read or written.
            return Ok(unsafe { Self::new_unchecked(queue, 0, 0) });
        }
        if !addr.is_multiple_of(std::mem::align_of::<T>() as u64) {
            return Err(Error::invalid(rank, arg, format!("{addr:#x} is not aligned for {}", T::DTYPE)));
        }
        let on = pointer_device(rank, arg, addr, bytes)?;
        if on != queue.device().ordinal() {
            return Err(Error::invalid(
                rank,
                arg,
                format!("{addr:#x} is on GPU {on} but the stream is on GPU {}", queue.device().ordinal()),
            ));
        }
        // SAFETY: checked above as far as the driver can tell; the rest is this function's
        // contract, forwarded.
        Ok(unsafe { Self::new_unchecked(queue, addr, len) })
    }

    /// Wraps `len` elements at `addr` without asking the driver.
    ///
    /// # Safety
    /// As [`ForeignBuffer::new`], and `addr` is aligned for `T` (or `len` is 0).
    pub unsafe fn new_unchecked(queue: &Queue, addr: u64, len: usize) -> Self {
        ForeignBuffer { addr: if len == 0 { 0 } else { addr }, len, queue: queue.clone(), elem: PhantomData }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address (0 when empty).
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

impl<T: DeviceElement> DeviceMemory for ForeignBuffer<T> {
    fn queue(&self) -> &Queue {
        &self.queue
    }

    fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The address as is: the caller orders other users of the memory (no cudarc event).
    fn read_ptr<'s>(&'s self, _stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
        (self.addr, None)
    }
}

impl<T: DeviceElement> DeviceMemoryMut for ForeignBuffer<T> {
    fn write_ptr<'s>(&'s mut self, _stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
        (self.addr, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_other_memory_is_refused_with_what_it_is() {
        assert_eq!(judge(0x7000, MEMORY_DEVICE, 1), Ok(1));
        let host = judge(0x7000, 0, -1).unwrap_err();
        assert!(host.contains("0x7000 is not CUDA memory (host memory?)"), "{host}");
        let pinned = judge(0x7000, MEMORY_HOST, 0).unwrap_err();
        assert!(pinned.contains("is host memory known to CUDA"), "{pinned}");
        assert!(judge(1, MEMORY_ARRAY, 0).unwrap_err().contains("CUDA array"));
        assert!(judge(1, MEMORY_UNIFIED, 0).unwrap_err().contains("unified host memory"));
        assert!(judge(1, MEMORY_DEVICE, -1).is_err(), "device memory of no GPU");
        assert!(judge(1, 99, 0).unwrap_err().contains("(99)"));
    }
}
