//! The buffers one set of [`Communicator`](crate::Communicator) calls accepts: host slices,
//! vectors and arrays, and (feature `cuda`) device `Buffer`s ([`crate::cuda::Buffer`]) and device
//! memory sucl did not allocate ([`crate::cuda::ForeignBuffer`], on the caller's stream). A call
//! looks at where its buffers live and sends host memory to the host backends and device memory
//! to the device backends (NCCL or staged), so a program does not change with the memory kind.

use crate::Element;
#[cfg(feature = "cuda")]
use sucl_cuda::{Buffer, BufferView, BufferViewMut, DeviceElement, DeviceMemory, DeviceMemoryMut, ForeignBuffer};

/// Where a buffer's bytes are, for reading.
pub enum Mem<'a> {
    /// Host memory.
    Host(&'a [u8]),
    /// CUDA device memory.
    #[cfg(feature = "cuda")]
    Device(&'a dyn DeviceMemory),
}

/// Where a buffer's bytes are, for writing.
pub enum MemMut<'a> {
    /// Host memory.
    Host(&'a mut [u8]),
    /// CUDA device memory.
    #[cfg(feature = "cuda")]
    Device(&'a mut dyn DeviceMemoryMut),
}

impl Mem<'_> {
    /// Whether this is device memory.
    pub fn is_device(&self) -> bool {
        !matches!(self, Mem::Host(_))
    }
}

impl MemMut<'_> {
    /// Whether this is device memory.
    pub fn is_device(&self) -> bool {
        !matches!(self, MemMut::Host(_))
    }
}

/// A typed buffer a call can read: its element type, length and memory.
pub trait Buf {
    /// The element type.
    type Elem: Element;
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether it holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Its bytes, wherever they live.
    fn mem(&self) -> Mem<'_>;
}

/// A typed buffer a call can write.
pub trait BufMut: Buf {
    /// Its bytes, writable.
    fn mem_mut(&mut self) -> MemMut<'_>;
}

impl<T: Element> Buf for [T] {
    type Elem = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn mem(&self) -> Mem<'_> {
        Mem::Host(bytemuck::cast_slice(self))
    }
}

impl<T: Element> BufMut for [T] {
    fn mem_mut(&mut self) -> MemMut<'_> {
        MemMut::Host(bytemuck::cast_slice_mut(self))
    }
}

impl<T: Element> Buf for Vec<T> {
    type Elem = T;
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn mem(&self) -> Mem<'_> {
        self.as_slice().mem()
    }
}

impl<T: Element> BufMut for Vec<T> {
    fn mem_mut(&mut self) -> MemMut<'_> {
        self.as_mut_slice().mem_mut()
    }
}

impl<T: Element, const N: usize> Buf for [T; N] {
    type Elem = T;
    fn len(&self) -> usize {
        N
    }
    fn mem(&self) -> Mem<'_> {
        self.as_slice().mem()
    }
}

impl<T: Element, const N: usize> BufMut for [T; N] {
    fn mem_mut(&mut self) -> MemMut<'_> {
        self.as_mut_slice().mem_mut()
    }
}

#[cfg(feature = "cuda")]
impl<T: DeviceElement> Buf for Buffer<T> {
    type Elem = T;
    fn len(&self) -> usize {
        Buffer::len(self)
    }
    fn mem(&self) -> Mem<'_> {
        Mem::Device(self)
    }
}

#[cfg(feature = "cuda")]
impl<T: DeviceElement> BufMut for Buffer<T> {
    fn mem_mut(&mut self) -> MemMut<'_> {
        MemMut::Device(self)
    }
}

#[cfg(feature = "cuda")]
impl<T: DeviceElement> Buf for BufferView<'_, T> {
    type Elem = T;
    fn len(&self) -> usize {
        BufferView::len(self)
    }
    fn mem(&self) -> Mem<'_> {
        Mem::Device(self)
    }
}

#[cfg(feature = "cuda")]
impl<T: DeviceElement> Buf for BufferViewMut<'_, T> {
    type Elem = T;
    fn len(&self) -> usize {
        BufferViewMut::len(self)
    }
    fn mem(&self) -> Mem<'_> {
        Mem::Device(self)
    }
}

#[cfg(feature = "cuda")]
impl<T: DeviceElement> BufMut for BufferViewMut<'_, T> {
    fn mem_mut(&mut self) -> MemMut<'_> {
        MemMut::Device(self)
    }
}

/// Device memory sucl did not allocate: its work is enqueued on the buffer's queue (the
/// caller's stream, for a C caller), as NCCL orders its calls.
#[cfg(feature = "cuda")]
impl<T: DeviceElement> Buf for ForeignBuffer<T> {
    type Elem = T;
    fn len(&self) -> usize {
        ForeignBuffer::len(self)
    }
    fn mem(&self) -> Mem<'_> {
        Mem::Device(self)
    }
}

#[cfg(feature = "cuda")]
impl<T: DeviceElement> BufMut for ForeignBuffer<T> {
    fn mem_mut(&mut self) -> MemMut<'_> {
        MemMut::Device(self)
    }
}
