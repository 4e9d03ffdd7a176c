//! [`QueueBuffer`]: the buffers a queue can be lent — host [`SharedBuf`]s and (feature `cuda`)
//! device [`DeviceBuf`]s — and what the queue asks of either whatever its kind.

#[cfg(feature = "cuda")]
use crate::device::DeviceBuf;
use crate::shared::SharedBuf;
use sucl_runtime::Element;

/// A buffer a [`CommQueue`](crate::CommQueue) can be lent: a host [`SharedBuf`] (host queues) or, with feature
/// `cuda`, a [`DeviceBuf`] (CUDA streams).
pub trait QueueBuffer<T: Element> {
    /// Which kind of buffer it is (used by the queue to pick the path).
    #[doc(hidden)]
    fn lent(&self) -> Lent<'_, T>;
}

/// The two kinds of [`QueueBuffer`].
#[doc(hidden)]
pub enum Lent<'a, T: Element> {
    Host(&'a SharedBuf<T>),
    #[cfg(feature = "cuda")]
    Device(&'a DeviceBuf<T>),
}

impl<T: Element> Lent<'_, T> {
    /// An address naming the buffer (every handle of one buffer gives the same).
    pub(crate) fn key(&self) -> usize {
        match self {
            Lent::Host(b) => b.key(),
            #[cfg(feature = "cuda")]
            Lent::Device(b) => b.key(),
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Lent::Host(b) => b.len(),
            #[cfg(feature = "cuda")]
            Lent::Device(b) => b.len(),
        }
    }
}

impl<T: Element> QueueBuffer<T> for SharedBuf<T> {
    fn lent(&self) -> Lent<'_, T> {
        Lent::Host(self)
    }
}

#[cfg(feature = "cuda")]
impl<T: Element> QueueBuffer<T> for DeviceBuf<T> {
    fn lent(&self) -> Lent<'_, T> {
        Lent::Device(self)
    }
}
