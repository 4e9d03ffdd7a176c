//! A Python object's memory as sucl sees it: a pointer, an element count and an element type,
//! plus a reference that keeps the memory alive. Accepted: anything with the buffer protocol
//! (NumPy arrays, bytearray, memoryview, array.array), read in place, torch CPU tensors,
//! read at `data_ptr()` (torch tensors have no buffer protocol), and other objects whose
//! `__dlpack__` exports host memory. Device memory: torch CUDA
//! tensors and objects with `__cuda_array_interface__` (v3), checked with the CUDA driver
//! (device memory of one GPU) when the region is made, before anything moves; a region of
//! device memory carries the CUDA stream its call is ordered on.

use crate::errors::invalid;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::intern;
use pyo3::prelude::*;
use sucl::DType;

/// What keeps a region's memory valid.
enum Keep {
    /// An exported buffer (released when dropped).
    Buffer(#[allow(dead_code)] PyUntypedBuffer),
    /// A tensor (the reference keeps its storage).
    Object(#[allow(dead_code)] Py<PyAny>),
}

/// Contiguous, aligned memory of one element type, valid while the region lives.
pub struct Region {
    addr: usize,
    /// Elements.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
    readonly: bool,
    /// Device memory: where it lives and the stream its call is ordered on. `None`: host.
    pub device: Option<OnDevice>,
    _keep: Keep,
}

/// Where a region of device memory lives and the stream that orders the calls using it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnDevice {
    /// The GPU's ordinal, as the driver names it.
    pub ordinal: usize,
    /// A `CUstream` (0: the legacy default stream).
    pub stream: u64,
}

/// Where an empty region points: its alignment (slices need a non-null aligned pointer).
fn dangling_if_empty(addr: usize, len: usize, align: usize) -> usize {
    if len == 0 {
        align
    } else {
        addr
    }
}

impl Region {
    /// The memory of `obj`; `arg` names it in errors. Fails on non-contiguous, misaligned or
    /// device memory and element types sucl does not have.
    /// `rank` (this process's world rank) names the rank in errors about device memory.
    pub fn of(arg: &str, obj: &Bound<'_, PyAny>, rank: usize) -> PyResult<Region> {
        Self::of_ordered(arg, obj, rank, true)
    }

    /// As [`Region::of`], for a caller that orders device memory itself (a stream-triggered
    /// queue, bound to its own stream): a torch tensor's current stream is not looked up (its
    /// region carries stream 0), which saves a Python call per tensor.
    pub fn of_unordered(arg: &str, obj: &Bound<'_, PyAny>, rank: usize) -> PyResult<Region> {
        Self::of_ordered(arg, obj, rank, false)
    }

    fn of_ordered(arg: &str, obj: &Bound<'_, PyAny>, rank: usize, with_stream: bool) -> PyResult<Region> {
        let py = obj.py();
        // SAFETY: `obj` is a live object and we are attached to the interpreter.
        let has_buffer = unsafe { pyo3::ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1;
        if !has_buffer {
            if obj.hasattr(intern!(py, "data_ptr"))? && obj.hasattr(intern!(py, "element_size"))? {
                return Self::of_tensor(arg, obj, rank, with_stream);
            }
            if let Ok(cai) = obj.getattr(intern!(py, "__cuda_array_interface__")) {
                return Self::of_cuda_array(arg, obj, &cai, rank);
            }
            if let Ok((kind, _)) = obj.call_method0(intern!(py, "__dlpack_device__")).and_then(|d| d.extract::<(i64, i64)>()) {
                if !crate::dlpack::HOST_DEVICE_TYPES.contains(&kind) {
                    return Err(invalid(
                        arg,
                        format!("a DLPack object on device type {kind}: pass a torch tensor or an object with __cuda_array_interface__"),
                    ));
                }
                let e = crate::dlpack::host_memory(arg, obj)?;
                return Self::checked(arg, e.addr, e.len, e.dtype, false, Keep::Object(e.capsule));
            }
        }
        let buf = PyUntypedBuffer::get(obj).map_err(|e| invalid(arg, format!("not a buffer or a tensor ({e})")))?;
        if !buf.is_c_contiguous() {
            return Err(invalid(arg, "the array is not C-contiguous (pass a contiguous copy)"));
        }
        let dtype = dtype_of_format(arg, buf.format().to_bytes(), buf.item_size())?;
        let (addr, len, readonly) = (buf.buf_ptr() as usize, buf.item_count(), buf.readonly());
        Self::checked(arg, addr, len, dtype, readonly, Keep::Buffer(buf))
    }

    /// A torch tensor: CPU or CUDA, contiguous, at `data_ptr()`. A CUDA tensor's call is
    /// ordered on torch's current stream of its device, as torch's NCCL backend orders it
    /// (looked up only `with_stream`; else stream 0).
    fn of_tensor(arg: &str, t: &Bound<'_, PyAny>, rank: usize, with_stream: bool) -> PyResult<Region> {
        let py = t.py();
        let is_cuda = t.getattr(intern!(py, "is_cuda"))?.is_truthy()?;
        let device: String = t.getattr(intern!(py, "device"))?.getattr(intern!(py, "type"))?.extract()?;
        if device != "cpu" && !is_cuda {
            return Err(invalid(arg, format!("a tensor on `{device}`: only CPU and CUDA tensors are supported")));
        }
        if !t.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
            return Err(invalid(arg, "the tensor is not contiguous (pass tensor.contiguous())"));
        }
        let name: String = t.getattr(intern!(py, "dtype"))?.str()?.extract()?;
        let dtype = dtype_of_torch(arg, &name)?;
        let addr: usize = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
        let len: usize = t.call_method0(intern!(py, "numel"))?.extract()?;
        let region = Self::checked(arg, addr, len, dtype, false, Keep::Object(t.clone().unbind()))?;
        if !is_cuda {
            return Ok(region);
        }
        if !with_stream {
            return region.on_gpu(arg, 0, rank);
        }
        let current = py
            .import(intern!(py, "torch"))?
            .getattr(intern!(py, "cuda"))?
            .call_method1(intern!(py, "current_stream"), (t.getattr(intern!(py, "device"))?,))?;
        let stream: u64 = current.getattr(intern!(py, "cuda_stream"))?.extract()?;
        region.on_gpu(arg, stream, rank)
    }

    /// An object with `__cuda_array_interface__` (v3): contiguous (`strides` None), its call
    /// ordered on the interface's `stream` (absent or None: the legacy default stream).
    fn of_cuda_array(arg: &str, obj: &Bound<'_, PyAny>, cai: &Bound<'_, PyAny>, rank: usize) -> PyResult<Region> {
        let bad = |why: &str| invalid(arg, format!("__cuda_array_interface__ {why}"));
        let cai = cai.cast::<pyo3::types::PyDict>().map_err(|_| bad("is not a dict"))?;
        let get = |key: &str| cai.get_item(key).ok().flatten().filter(|v| !v.is_none());
        if get("strides").is_some() {
            return Err(invalid(arg, "the CUDA array is not C-contiguous (strides given): pass a contiguous copy"));
        }
        let (addr, _readonly): (usize, bool) =
            get("data").ok_or_else(|| bad("has no `data`"))?.extract().map_err(|_| bad("`data` is not (ptr, readonly)"))?;
        let shape: Vec<usize> =
            get("shape").ok_or_else(|| bad("has no `shape`"))?.extract().map_err(|_| bad("`shape` is not a tuple of sizes"))?;
        let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| bad("`shape` overflows"))?;
        let typestr: String =
            get("typestr").ok_or_else(|| bad("has no `typestr`"))?.extract().map_err(|_| bad("`typestr` is not a string"))?;
        let dtype = dtype_of_typestr(arg, &typestr)?;
        // CAI v3: 1 is the legacy default stream, 2 the per-thread one; any other a CUstream.
        let stream = match get("stream") {
            None => 0,
            Some(s) => match s.extract::<u64>().map_err(|_| bad("`stream` is not an integer"))? {
                1 => 0,
                2 => PER_THREAD_STREAM,
                0 => return Err(bad("`stream` is 0, which version 3 forbids")),
                other => other,
            },
        };
        Self::checked(arg, addr, len, dtype, false, Keep::Object(obj.clone().unbind()))?.on_gpu(arg, stream, rank)
    }

    /// This region as device memory, asked of the CUDA driver: one GPU's device memory from
    /// the first byte to the last, else a clear error (host memory, no driver) before anything
    /// moves. Empty regions are taken as they are (on GPU 0 unless the call's other buffer says).
    fn on_gpu(mut self, arg: &str, stream: u64, rank: usize) -> PyResult<Region> {
        let ordinal = if self.len == 0 {
            0
        } else {
            sucl::cuda::pointer_device(rank, static_name(arg), self.addr as u64, self.bytes()).map_err(crate::errors::to_py)?
        };
        self.device = Some(OnDevice { ordinal, stream });
        Ok(self)
    }

    fn checked(arg: &str, addr: usize, len: usize, dtype: DType, readonly: bool, keep: Keep) -> PyResult<Region> {
        let addr = dangling_if_empty(addr, len, dtype.size());
        if !addr.is_multiple_of(dtype.size()) {
            return Err(invalid(arg, format!("its memory is not aligned to its {}-byte elements", dtype.size())));
        }
        Ok(Region { addr, len, dtype, readonly, device: None, _keep: keep })
    }

    /// Fails unless the region may be written.
    pub fn writable(self, arg: &str) -> PyResult<Region> {
        if self.readonly {
            return Err(invalid(arg, "is read-only but is written"));
        }
        Ok(self)
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// Its start address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Whether its bytes overlap `other`'s.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.bytes() > 0 && other.bytes() > 0 && self.addr < other.addr + other.bytes() && other.addr < self.addr + self.bytes()
    }

    /// Whether it covers exactly `other`'s bytes.
    pub fn same_memory(&self, other: &Region) -> bool {
        self.addr == other.addr && self.bytes() == other.bytes()
    }

    /// The memory as a slice.
    ///
    /// # Safety
    /// `T` must be the element type `self.dtype` names, and no `&mut` slice of these bytes may
    /// be alive at the same time.
    pub unsafe fn slice<T>(&self) -> &[T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        // SAFETY: `addr` is non-null and aligned (checked in `checked`), `len` elements of `T`
        // live there while `_keep` holds the exporter; the caller vouches for `T` and aliasing.
        unsafe { std::slice::from_raw_parts(self.addr as *const T, self.len) }
    }

    /// The memory as a mutable slice.
    ///
    /// # Safety
    /// As [`Region::slice`], and the region must be writable and no other slice of these bytes
    /// may be alive at the same time.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T>(&self) -> &mut [T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        // SAFETY: as in `slice`; writability was checked when the call was built
        // (`Region::writable`) and the caller vouches that no other slice aliases it.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut T, self.len) }
    }
}

/// `CU_STREAM_PER_THREAD`, the per-thread default stream's handle.
const PER_THREAD_STREAM: u64 = 2;

/// The argument names sucl's errors take (`&'static str`) for a Python argument name.
pub fn static_name(arg: &str) -> &'static str {
    match arg {
        "send" => "send",
        "recv" => "recv",
        "buf" => "buf",
        _ => "buffer",
    }
}

/// The element type of a `__cuda_array_interface__` typestr (NumPy's array-interface syntax).
fn dtype_of_typestr(arg: &str, typestr: &str) -> PyResult<DType> {
    let b = typestr.as_bytes();
    let (order, code, size) = match b {
        [o, c, n @ ..] if !n.is_empty() => (*o, *c, std::str::from_utf8(n).ok().and_then(|n| n.parse::<usize>().ok())),
        _ => (b'?', b'?', None),
    };
    let Some(size) = size.filter(|_| matches!(order, b'<' | b'|' | b'=')) else {
        return Err(invalid(arg, format!("element typestr {typestr:?} has no sucl type")));
    };
    let format = match code {
        b'i' => b'q',
        b'u' | b'b' => b'Q',
        b'f' => match size {
            2 => b'e',
            4 => b'f',
            _ => b'd',
        },
        _ => return Err(invalid(arg, format!("element typestr {typestr:?} has no sucl type"))),
    };
    dtype_of_format(arg, &[b'=', format], size).map_err(|_| invalid(arg, format!("element typestr {typestr:?} has no sucl type")))
}

/// The element type of a buffer-protocol format string (struct module syntax).
fn dtype_of_format(arg: &str, format: &[u8], item_size: usize) -> PyResult<DType> {
    let (order, code) = match format {
        [c] => (b'@', *c),
        [o, c] => (*o, *c),
        _ => return Err(invalid(arg, format!("unsupported element format {:?}", String::from_utf8_lossy(format)))),
    };
    if !matches!(order, b'@' | b'=' | b'<' | b'>' | b'!') {
        return Err(invalid(arg, format!("unsupported element format {:?}", String::from_utf8_lossy(format))));
    }
    if matches!(order, b'>' | b'!') && item_size > 1 && cfg!(target_endian = "little") {
        return Err(invalid(arg, "big-endian elements are not supported"));
    }
    let signed = |n| match n {
        1 => Some(DType::I8),
        4 => Some(DType::I32),
        8 => Some(DType::I64),
        _ => None,
    };
    let unsigned = |n| match n {
        1 => Some(DType::U8),
        4 => Some(DType::U32),
        8 => Some(DType::U64),
        _ => None,
    };
    let dtype = match code {
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => signed(item_size),
        b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' | b'?' | b'c' => unsigned(item_size),
        b'e' => Some(DType::F16),
        b'f' => Some(DType::F32),
        b'd' => Some(DType::F64),
        _ => None,
    };
    dtype
        .filter(|d| d.size() == item_size)
        .ok_or_else(|| invalid(arg, format!("element format {:?} ({item_size} bytes) has no sucl type", String::from_utf8_lossy(format))))
}

/// The element type of a torch dtype's name (`str(tensor.dtype)`).
fn dtype_of_torch(arg: &str, name: &str) -> PyResult<DType> {
    Ok(match name {
        "torch.float32" => DType::F32,
        "torch.float64" => DType::F64,
        "torch.float16" => DType::F16,
        "torch.bfloat16" => DType::BF16,
        "torch.int32" => DType::I32,
        "torch.int64" => DType::I64,
        "torch.uint8" | "torch.bool" => DType::U8,
        "torch.int8" => DType::I8,
        "torch.uint32" => DType::U32,
        "torch.uint64" => DType::U64,
        other => return Err(invalid(arg, format!("tensor dtype {other} has no sucl type"))),
    })
}

pub(crate) use sucl::with_dtype as typed;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_formats_map_to_sucl_types_by_kind_and_size() {
        assert_eq!(dtype_of_format("x", b"f", 4).ok(), Some(DType::F32));
        assert_eq!(dtype_of_format("x", b"<d", 8).ok(), Some(DType::F64));
        assert_eq!(dtype_of_format("x", b"l", 8).ok(), Some(DType::I64));
        assert_eq!(dtype_of_format("x", b"L", 4).ok(), Some(DType::U32));
        assert_eq!(dtype_of_format("x", b"B", 1).ok(), Some(DType::U8));
        assert_eq!(dtype_of_format("x", b"e", 2).ok(), Some(DType::F16));
        assert_eq!(dtype_of_format("x", b"?", 1).ok(), Some(DType::U8));
    }

    #[test]
    fn formats_without_a_sucl_type_are_refused() {
        assert!(dtype_of_format("x", b"h", 2).is_err(), "int16");
        assert!(dtype_of_format("x", b">f", 4).is_err(), "big-endian");
        assert!(dtype_of_format("x", b"Zf", 8).is_err(), "complex");
        assert!(dtype_of_format("x", b"T{f}", 4).is_err(), "struct");
        assert!(dtype_of_format("x", b"f", 8).is_err(), "size disagrees with the code");
    }

    #[test]
    fn torch_dtype_names_map_to_sucl_types() {
        assert_eq!(dtype_of_torch("x", "torch.bfloat16").ok(), Some(DType::BF16));
        assert_eq!(dtype_of_torch("x", "torch.bool").ok(), Some(DType::U8));
        assert!(dtype_of_torch("x", "torch.complex64").is_err());
    }

    #[test]
    fn cuda_array_typestrs_map_to_sucl_types() {
        assert_eq!(dtype_of_typestr("x", "<f4").ok(), Some(DType::F32));
        assert_eq!(dtype_of_typestr("x", "<f2").ok(), Some(DType::F16));
        assert_eq!(dtype_of_typestr("x", "<i8").ok(), Some(DType::I64));
        assert_eq!(dtype_of_typestr("x", "|u1").ok(), Some(DType::U8));
        assert_eq!(dtype_of_typestr("x", "|b1").ok(), Some(DType::U8));
        assert!(dtype_of_typestr("x", ">f4").is_err(), "big-endian");
        assert!(dtype_of_typestr("x", "<c8").is_err(), "complex");
        assert!(dtype_of_typestr("x", "<i2").is_err(), "int16");
        assert!(dtype_of_typestr("x", "f").is_err(), "no size");
    }
}
