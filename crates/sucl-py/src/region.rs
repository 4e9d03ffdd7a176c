//! A Python object's memory as sucl sees it: a pointer, an element count and an element type,
//! plus a reference that keeps the memory alive. Accepted: anything with the buffer protocol
//! (NumPy arrays, bytearray, memoryview, array.array), read in place, and torch CPU tensors,
//! read at `data_ptr()` (torch tensors have no buffer protocol). Device memory is refused.

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
    _keep: Keep,
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
    pub fn of(arg: &str, obj: &Bound<'_, PyAny>) -> PyResult<Region> {
        let py = obj.py();
        // SAFETY: `obj` is a live object and we are attached to the interpreter.
        let has_buffer = unsafe { pyo3::ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1;
        if !has_buffer {
            if obj.hasattr(intern!(py, "data_ptr"))? && obj.hasattr(intern!(py, "element_size"))? {
                return Self::of_tensor(arg, obj);
            }
            if obj.hasattr(intern!(py, "__cuda_array_interface__"))? {
                return Err(device_refused(arg));
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

    /// A torch tensor: CPU, contiguous, at `data_ptr()`.
    fn of_tensor(arg: &str, t: &Bound<'_, PyAny>) -> PyResult<Region> {
        let py = t.py();
        if t.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
            return Err(device_refused(arg));
        }
        let device: String = t.getattr(intern!(py, "device"))?.getattr(intern!(py, "type"))?.extract()?;
        if device != "cpu" {
            return Err(invalid(arg, format!("a tensor on `{device}`: only CPU tensors are supported")));
        }
        if !t.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
            return Err(invalid(arg, "the tensor is not contiguous (pass tensor.contiguous())"));
        }
        let name: String = t.getattr(intern!(py, "dtype"))?.str()?.extract()?;
        let dtype = dtype_of_torch(arg, &name)?;
        let addr: usize = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
        let len: usize = t.call_method0(intern!(py, "numel"))?.extract()?;
        Self::checked(arg, addr, len, dtype, false, Keep::Object(t.clone().unbind()))
    }

    fn checked(arg: &str, addr: usize, len: usize, dtype: DType, readonly: bool, keep: Keep) -> PyResult<Region> {
        let addr = dangling_if_empty(addr, len, dtype.size());
        if !addr.is_multiple_of(dtype.size()) {
            return Err(invalid(arg, format!("its memory is not aligned to its {}-byte elements", dtype.size())));
        }
        Ok(Region { addr, len, dtype, readonly, _keep: keep })
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

fn device_refused(arg: &str) -> PyErr {
    invalid(
        arg,
        "device (CUDA) memory: the Python binding moves host memory only, because sucl's CUDA layer \
         cannot wrap a device pointer it did not allocate",
    )
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

/// Runs `$body` with `$T` bound to the Rust element type of `$dtype`.
macro_rules! typed {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            sucl::DType::U8 => {
                type $T = u8;
                $body
            }
            sucl::DType::I8 => {
                type $T = i8;
                $body
            }
            sucl::DType::I32 => {
                type $T = i32;
                $body
            }
            sucl::DType::U32 => {
                type $T = u32;
                $body
            }
            sucl::DType::I64 => {
                type $T = i64;
                $body
            }
            sucl::DType::U64 => {
                type $T = u64;
                $body
            }
            sucl::DType::F16 => {
                type $T = sucl::f16;
                $body
            }
            sucl::DType::BF16 => {
                type $T = sucl::bf16;
                $body
            }
            sucl::DType::F32 => {
                type $T = f32;
                $body
            }
            sucl::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use typed;

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
}
