//! A session's device objects (buffers, queues, events, compiled kernels) and what finds and
//! checks them; the commands on them are in `commands`.

use super::config::*;
use crate::kernels::HostMem;
use crate::wire::{code, failed, DeviceInfo, DeviceKind, Outcome, SessionStats};
use std::collections::HashMap;

/// One device the daemon serves.
pub(super) enum Served {
    Host {
        name: String,
        memory: u64,
    },
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaServed),
    OpenCl(crate::opencl::ClServed),
}

impl Served {
    pub(super) fn info(&self) -> DeviceInfo {
        match self {
            Served::Host { name, memory } => DeviceInfo { kind: DeviceKind::Host, name: name.clone(), memory: *memory },
            #[cfg(feature = "cuda")]
            Served::Cuda(c) => c.info(),
            Served::OpenCl(c) => c.info(),
        }
    }
}

/// Device memory of one buffer.
pub(super) enum Mem {
    Host(HostMem),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaMem),
    OpenCl(crate::opencl::ClMem),
}

impl Mem {
    pub(super) fn len(&self) -> usize {
        match self {
            Mem::Host(m) => m.len(),
            #[cfg(feature = "cuda")]
            Mem::Cuda(m) => m.len(),
            Mem::OpenCl(m) => m.len(),
        }
    }
}

pub(super) struct Buf {
    pub(super) device: u32,
    pub(super) mem: Mem,
    /// The buffer holding how many of this one's bytes are meaningful (content size).
    pub(super) content: Option<u64>,
}

/// The objects of one session and its counters.
#[derive(Default)]
pub(super) struct Objects {
    pub(super) buffers: HashMap<u64, Buf>,
    pub(super) queues: HashMap<u64, u32>,
    pub(super) events: HashMap<u64, Ev>,
    /// CUDA kernels this session compiled, by device and name.
    #[cfg(feature = "cuda")]
    pub(super) cuda_kernels: HashMap<(u32, String), sucl_cuda::Kernel>,
    pub(super) stats: SessionStats,
    /// Buffers freed by the client while a mesh member may still copy from them (kept until
    /// their peer-memory offers are settled, or the session ends).
    pub(super) held: Vec<(u64, Buf)>,
    /// Interprocess events and peers' mappings of the peer-memory path.
    #[cfg(feature = "cuda")]
    pub(super) peer_mem: PeerMemHandles,
    /// OpenCL programs this session built, by id: (device, program).
    pub(super) cl_programs: HashMap<u64, (u32, crate::opencl::ClProgram)>,
    /// OpenCL kernels this session made, by id: (device, kernel).
    pub(super) cl_kernels: HashMap<u64, (u32, crate::opencl::ClKernel)>,
    /// The last OpenCL launch on each queue (every other OpenCL command is over when answered).
    pub(super) cl_last: HashMap<u64, crate::opencl::ClEvent>,
    /// The launch an event was recorded behind, whose times it answers (see
    /// [`crate::wire::cl_query::EVENT_PROFILE`]).
    pub(super) cl_profiles: HashMap<u64, crate::opencl::ClEvent>,
}

/// What the peer-memory path keeps open for a session (all closed when the session goes).
#[cfg(feature = "cuda")]
#[derive(Default)]
pub(super) struct PeerMemHandles {
    /// Source side: the event recorded before each offer to a member, per (member, device).
    /// One suffices: the next offer to that member is made only once the last was answered.
    pub(super) ready: HashMap<(u32, u32), crate::cuda::IpcEvent>,
    /// Destination side: the event recorded after each copy from a member, per (member,
    /// device); reused likewise.
    pub(super) done: HashMap<(u32, u32), crate::cuda::IpcEvent>,
    /// Members' events opened here, per (member, device, handle).
    pub(super) opened_events: HashMap<(u32, u32, [u8; 64]), crate::cuda::OpenedEvent>,
    /// Members' buffers mapped here, per (member, device, handle).
    pub(super) opened_mem: HashMap<(u32, u32, [u8; 64]), crate::cuda::OpenedMem>,
    /// This session's buffers exported to members: buffer → (handle, members told).
    pub(super) shared: HashMap<u64, ([u8; 64], Vec<u32>)>,
}

pub(super) enum Ev {
    /// Commands of a session run in order, so a host event is complete when recorded.
    Done,
    /// Recorded behind an OpenCL launch (the last on its queue): complete when it is.
    Cl(crate::opencl::ClEvent),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaEv),
}

/// `offset..offset+len` inside a buffer of `size` bytes, or why not.
pub(super) fn span(what: &str, offset: u64, len: u64, size: usize) -> Result<std::ops::Range<usize>, Outcome> {
    match offset.checked_add(len) {
        Some(end) if end <= size as u64 => Ok(offset as usize..end as usize),
        _ => Err(failed(code::INVALID, format!("{what}: bytes {offset}..{offset}+{len} are outside the buffer's {size} bytes"))),
    }
}

/// The content size of buffer `id` if it has a size buffer.
pub(super) fn content_len(o: &mut Objects, id: u64) -> Result<Option<u64>, Outcome> {
    let Some(sb) = buffer(o, id)?.content else { return Ok(None) };
    let b = buffer(o, sb).map_err(|_| failed(code::INVALID, format!("the size buffer {sb} of buffer {id} was freed")))?;
    let mut v = [0u8; 8];
    match &b.mem {
        Mem::Host(m) => v.copy_from_slice(&m.bytes()[..8]),
        #[cfg(feature = "cuda")]
        Mem::Cuda(m) => v.copy_from_slice(&m.read(0..8)?),
        Mem::OpenCl(m) => v.copy_from_slice(&m.read(0..8)?.0),
    }
    Ok(Some(u64::from_le_bytes(v)))
}

pub(super) fn set_content_len(o: &mut Objects, sb: u64, n: u64) -> Result<(), Outcome> {
    let b = buffer(o, sb)?;
    match &mut b.mem {
        Mem::Host(m) => m.bytes_mut()[..8].copy_from_slice(&n.to_le_bytes()),
        #[cfg(feature = "cuda")]
        Mem::Cuda(m) => m.write(0, &n.to_le_bytes())?,
        Mem::OpenCl(m) => {
            m.write(0, &n.to_le_bytes())?;
        }
    }
    Ok(())
}

/// `len` trimmed to the buffer's meaningful bytes after `offset` (content size).
pub(super) fn trimmed(o: &mut Objects, id: u64, offset: u64, len: u64) -> Result<u64, Outcome> {
    Ok(match content_len(o, id)? {
        Some(c) => len.min(c.saturating_sub(offset)),
        None => len,
    })
}

/// What the commands on a session's objects need to know of the daemon and the session.
pub(super) struct Ctx<'a> {
    pub(super) devices: &'a [Served],
    pub(super) cfg: &'a DaemonConfig,
    /// The session's frame limit.
    pub(super) max_frame: u32,
    /// Whether the session is in a peer mesh (a recorded CUDA event is then waited for at once,
    /// so that peers can be told it completed).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // host events complete when recorded
    pub(super) in_mesh: bool,
}

pub(super) fn device<'a>(ctx: &Ctx<'a>, device: u32) -> Result<&'a Served, Outcome> {
    ctx.devices
        .get(device as usize)
        .ok_or_else(|| failed(code::INVALID, format!("device {device} does not exist ({} offered)", ctx.devices.len())))
}

pub(super) fn buffer(o: &mut Objects, id: u64) -> Result<&mut Buf, Outcome> {
    o.buffers.get_mut(&id).ok_or_else(|| failed(code::INVALID, format!("buffer {id} does not exist in this session")))
}
