//! Test-only fault injection (cargo feature `fault-hook`; absent from normal builds).
//!
//! `SUCL_FAULT_CORRUPT=<backend>[:<op>,<op>...]` (backend: shm, tcp, mpi, nccl or staged)
//! corrupts one element — the last — of every output that backend returns from a collective
//! (only of the listed ops, if any), after the backend returned and before the caller sees it.
//! The tests use it to show that `sucl check` and `sucl bench` notice a broken backend.

use std::sync::OnceLock;
use sucl_core::CollOp;

/// The backend and ops to corrupt, read once from the environment.
struct Target {
    backend: String,
    ops: Option<Vec<CollOp>>,
}

fn target() -> Option<&'static Target> {
    static TARGET: OnceLock<Option<Target>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let v = std::env::var("SUCL_FAULT_CORRUPT").ok().filter(|v| !v.is_empty())?;
            let (backend, ops) = match v.split_once(':') {
                Some((b, list)) => (b, Some(list.split(',').filter_map(|o| CollOp::parse(o.trim())).collect())),
                None => (v.as_str(), None),
            };
            tracing::warn!(value = v.as_str(), "SUCL_FAULT_CORRUPT: collective outputs will be corrupted on purpose");
            Some(Target { backend: backend.to_string(), ops })
        })
        .as_ref()
}

/// Whether `backend`'s output of `op` is to be corrupted.
pub(crate) fn hits(backend: &str, op: CollOp) -> bool {
    target().is_some_and(|t| t.backend == backend && t.ops.as_ref().is_none_or(|ops| ops.contains(&op)))
}

/// The byte offset of the byte to corrupt in an output of `len` bytes of `elem_size`-byte
/// elements: the most significant byte of the last element (an exponent bit of a float, so
/// that no rounding tolerance can hide the change), if there is an element.
pub(crate) fn corrupt_offset(len: usize, elem_size: usize) -> Option<usize> {
    (elem_size > 0 && len >= elem_size).then(|| len / elem_size * elem_size - 1)
}

/// The corruption applied to that byte.
pub(crate) const FLIP: u8 = 0x40;

/// Corrupts the last element of a host output.
pub(crate) fn corrupt_last(out: &mut [u8], elem_size: usize) {
    if let Some(at) = corrupt_offset(out.len(), elem_size) {
        out[at] ^= FLIP;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_elements_top_byte_changes() {
        let mut v = [1.0f32, 2.0, 3.0];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
        corrupt_last(bytes, 4);
        assert_eq!(&v[..2], &[1.0, 2.0]);
        assert!(v[2] != 3.0 && (v[2] - 3.0).abs() > 1.0, "{}", v[2]);
        let mut empty: [u8; 0] = [];
        corrupt_last(&mut empty, 4);
        assert_eq!(corrupt_offset(7, 2), Some(5));
    }
}
