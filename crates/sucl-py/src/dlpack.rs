//! Host memory of objects that offer only DLPack (`__dlpack__` / `__dlpack_device__`), read
//! from the exporter's capsule. The capsule is kept, not consumed: while it lives the exporter
//! keeps the memory valid, and when it is released unconsumed its own destructor frees the
//! tensor (the DLPack protocol's rule for a capsule still named "dltensor").

use crate::errors::invalid;
use pyo3::intern;
use pyo3::prelude::*;
use std::ffi::c_void;
use sucl::DType;

/// DLPack's `kDLCPU` and `kDLCUDAHost` (pinned host memory) device types.
pub const HOST_DEVICE_TYPES: [i64; 2] = [1, 3];

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`, the first member of the `DLManagedTensor` a "dltensor" capsule points to.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// What a DLPack export describes: its first element's address, element count and type, and
/// the capsule that keeps it alive.
pub struct Exported {
    pub addr: usize,
    pub len: usize,
    pub dtype: DType,
    pub capsule: Py<PyAny>,
}

/// The host memory `obj` exports through `__dlpack__()`: C-contiguous, of a sucl element type.
pub fn host_memory(arg: &str, obj: &Bound<'_, PyAny>) -> PyResult<Exported> {
    let py = obj.py();
    let capsule = obj.call_method0(intern!(py, "__dlpack__")).map_err(|e| invalid(arg, format!("its __dlpack__() failed: {e}")))?;
    let name = c"dltensor";
    // SAFETY: `capsule` is a live object; both calls accept any object and a C string.
    let ptr = unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule.as_ptr(), name.as_ptr()) != 1 {
            return Err(invalid(arg, "its __dlpack__() did not return an unconsumed \"dltensor\" capsule"));
        }
        pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr()) as *const DlTensor
    };
    if ptr.is_null() {
        return Err(invalid(arg, "its DLPack capsule holds no tensor"));
    }
    // SAFETY: a valid "dltensor" capsule points to a `DLManagedTensor`, whose first member is
    // this `DLTensor`; the exporter keeps it (and `shape`/`strides`) alive while the capsule
    // lives, and we hold the capsule.
    let t = unsafe { &*ptr };
    if !HOST_DEVICE_TYPES.contains(&i64::from(t.device.device_type)) {
        return Err(invalid(arg, format!("a DLPack tensor on device type {}: only host memory is taken this way", t.device.device_type)));
    }
    let ndim = usize::try_from(t.ndim).map_err(|_| invalid(arg, "its DLPack ndim is negative"))?;
    if ndim > 0 && t.shape.is_null() {
        return Err(invalid(arg, "its DLPack shape is missing"));
    }
    // SAFETY: `shape` (and `strides` when not null) hold `ndim` entries (DLPack's layout).
    let shape = if ndim == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(t.shape, ndim) } };
    let strides = if t.strides.is_null() || ndim == 0 { None } else { Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) }) };
    let len = element_count(shape).ok_or_else(|| invalid(arg, format!("its DLPack shape {shape:?} is invalid")))?;
    if let Some(strides) = strides {
        if !row_major(shape, strides) {
            return Err(invalid(arg, "the DLPack tensor is not C-contiguous (pass a contiguous copy)"));
        }
    }
    let dtype = dtype_of_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes).ok_or_else(|| {
        invalid(
            arg,
            format!("DLPack element type (code {}, {} bits, {} lanes) has no sucl type", t.dtype.code, t.dtype.bits, t.dtype.lanes),
        )
    })?;
    let offset = usize::try_from(t.byte_offset).map_err(|_| invalid(arg, "its DLPack byte_offset overflows"))?;
    let addr = (t.data as usize).checked_add(offset).ok_or_else(|| invalid(arg, "its DLPack address overflows"))?;
    Ok(Exported { addr, len, dtype, capsule: capsule.unbind() })
}

/// The product of `shape`, or None for a negative size or an overflow.
fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

/// Whether `strides` (in elements) lay `shape` out densely in row-major order (dimensions of
/// size 1 may have any stride; an empty tensor has no layout).
fn row_major(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut want = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != want {
            return false;
        }
        want = want.saturating_mul(d);
    }
    true
}

/// The sucl type of a DLPack `(code, bits, lanes)`: kDLInt 0, kDLUInt 1, kDLFloat 2,
/// kDLBfloat 4, kDLBool 6.
fn dtype_of_dlpack(code: u8, bits: u8, lanes: u16) -> Option<DType> {
    if lanes != 1 {
        return None;
    }
    Some(match (code, bits) {
        (0, 8) => DType::I8,
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (1, 8) | (6, 8) => DType::U8,
        (1, 32) => DType::U32,
        (1, 64) => DType::U64,
        (2, 16) => DType::F16,
        (2, 32) => DType::F32,
        (2, 64) => DType::F64,
        (4, 16) => DType::BF16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_types_map_to_sucl_types() {
        assert_eq!(dtype_of_dlpack(2, 32, 1), Some(DType::F32));
        assert_eq!(dtype_of_dlpack(4, 16, 1), Some(DType::BF16));
        assert_eq!(dtype_of_dlpack(6, 8, 1), Some(DType::U8));
        assert_eq!(dtype_of_dlpack(0, 16, 1), None, "int16");
        assert_eq!(dtype_of_dlpack(2, 32, 4), None, "vector lanes");
        assert_eq!(dtype_of_dlpack(5, 64, 1), None, "complex");
    }

    #[test]
    fn only_dense_row_major_strides_are_contiguous() {
        assert!(row_major(&[2, 3], &[3, 1]));
        assert!(row_major(&[2, 1, 3], &[3, 99, 1]), "a size-1 dimension's stride does not matter");
        assert!(!row_major(&[2, 3], &[1, 2]), "column-major");
        assert!(!row_major(&[4], &[2]), "every other element");
        assert!(row_major(&[0, 3], &[7, 5]), "empty");
        assert_eq!(element_count(&[2, -1]), None);
        assert_eq!(element_count(&[]), Some(1));
    }
}
