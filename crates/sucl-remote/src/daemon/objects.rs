//! A session's device objects (buffers, queues, events, compiled kernels) and the commands that
//! work on them alone, without peers.

use super::config::*;
use crate::kernels::{HostMem, KernelCall};
use crate::wire::{self, code, failed, Arg, Command, DeviceInfo, DeviceKind, Outcome, SessionStats};
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

/// Runs a command that involves only the session's objects (not its peers).
pub(super) fn run(ctx: &Ctx, o: &mut Objects, cmd: Command) -> Result<Outcome, Outcome> {
    let max_frame = ctx.max_frame;
    let limits = &ctx.cfg.limits;
    match cmd {
        Command::Nop => Ok(Outcome::Done),
        Command::Devices => Ok(Outcome::Devices(ctx.devices.iter().map(Served::info).collect())),
        Command::CreateQueue { queue, device: d } => {
            device(ctx, d)?;
            if o.queues.contains_key(&queue) {
                return Err(failed(code::INVALID, format!("queue {queue} already exists")));
            }
            if o.queues.len() >= limits.max_queues as usize {
                return Err(failed(code::LIMIT, format!("the session already holds {} queues (its limit)", limits.max_queues)));
            }
            o.queues.insert(queue, d);
            Ok(Outcome::Done)
        }
        Command::Alloc { buffer: id, device: d, bytes } => {
            let dev = device(ctx, d)?;
            if o.buffers.contains_key(&id) {
                return Err(failed(code::INVALID, format!("buffer {id} already exists")));
            }
            if o.buffers.len() >= limits.max_buffers as usize {
                return Err(failed(code::LIMIT, format!("the session already holds {} buffers (its limit)", limits.max_buffers)));
            }
            let in_use = o.stats.bytes_in_use;
            if in_use.saturating_add(bytes) > limits.max_bytes {
                return Err(failed(
                    code::LIMIT,
                    format!("allocating {bytes} bytes would exceed the session's memory limit: {in_use} in use of {}", limits.max_bytes),
                ));
            }
            let mem = match dev {
                Served::Host { .. } => Mem::Host(HostMem::zeroed(bytes as usize)),
                #[cfg(feature = "cuda")]
                Served::Cuda(c) => Mem::Cuda(c.alloc(bytes as usize)?),
                Served::OpenCl(c) => Mem::OpenCl(c.alloc(bytes as usize)?),
            };
            o.buffers.insert(id, Buf { device: d, mem, content: None });
            o.stats.bytes_in_use += bytes;
            o.stats.buffers = o.buffers.len() as u32;
            Ok(Outcome::Done)
        }
        Command::Free { buffer: id } => {
            let b = o.buffers.remove(&id).ok_or_else(|| failed(code::INVALID, format!("buffer {id} does not exist in this session")))?;
            o.stats.bytes_in_use -= b.mem.len() as u64;
            o.stats.buffers = o.buffers.len() as u32;
            Ok(Outcome::Done)
        }
        Command::Write { buffer: id, offset, data } => {
            let b = buffer(o, id)?;
            let r = span("write", offset, data.len() as u64, b.mem.len())?;
            match &mut b.mem {
                Mem::Host(m) => m.bytes_mut()[r].copy_from_slice(&data),
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => m.write(r.start, &data)?,
                Mem::OpenCl(m) => {
                    m.write(r.start, &data)?;
                }
            }
            Ok(Outcome::Done)
        }
        Command::Read { buffer: id, offset, len } => {
            let room = (max_frame as usize).saturating_sub(wire::READ_REPLY_OVERHEAD) as u64;
            if len > room {
                return Err(failed(code::INVALID, format!("a read of {len} bytes does not fit one frame (at most {room}); split it")));
            }
            let len = trimmed(o, id, offset, len)?;
            let b = buffer(o, id)?;
            let r = span("read", offset, len, b.mem.len())?;
            match &b.mem {
                Mem::Host(m) => Ok(Outcome::Data(m.bytes()[r].to_vec())),
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => Ok(Outcome::Data(m.read(r)?)),
                Mem::OpenCl(m) => Ok(Outcome::Data(m.read(r)?.0)),
            }
        }
        Command::Copy { src, src_offset, dst, dst_offset, len } => {
            let len = trimmed(o, src, src_offset, len)?;
            copy(o, src, src_offset, dst, dst_offset, len)
        }
        Command::SetContentSize { buffer: id, size_buffer } => {
            if size_buffer != 0 {
                let dev = buffer(o, id)?.device;
                let sb = buffer(o, size_buffer)?;
                if size_buffer == id || sb.mem.len() < 8 || sb.device != dev {
                    return Err(failed(
                        code::INVALID,
                        format!("size buffer {size_buffer}: must be another buffer of at least 8 bytes on the same device as buffer {id}"),
                    ));
                }
            }
            buffer(o, id)?.content = (size_buffer != 0).then_some(size_buffer);
            Ok(Outcome::Done)
        }
        Command::ClBuild { .. }
        | Command::ClCompile { .. }
        | Command::ClLink { .. }
        | Command::ClKernel { .. }
        | Command::ClLaunch { .. }
        | Command::ClQuery { .. }
        | Command::ClRelease { .. } => unreachable!("OpenCL commands run in cl"),
        Command::Stats | Command::JoinMesh { .. } | Command::MigrateIn { .. } | Command::MigrateOut { .. } | Command::WaitRemote { .. } => {
            unreachable!("peer commands and stats run in exec")
        }
        Command::Fill { buffer: id, offset, len, pattern } => {
            if pattern.is_empty() || len % pattern.len() as u64 != 0 {
                return Err(failed(code::INVALID, format!("fill: {len} bytes are not a whole number of {}-byte patterns", pattern.len())));
            }
            let b = buffer(o, id)?;
            let r = span("fill", offset, len, b.mem.len())?;
            match &mut b.mem {
                Mem::Host(m) => {
                    for chunk in m.bytes_mut()[r].chunks_exact_mut(pattern.len()) {
                        chunk.copy_from_slice(&pattern);
                    }
                }
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => m.fill(r, &pattern)?,
                Mem::OpenCl(m) => {
                    m.fill(r, &pattern)?;
                }
            }
            Ok(Outcome::Done)
        }
        Command::Launch { queue, kernel, args, range } => launch(ctx, o, queue, &kernel, &args, range),
        #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
        Command::CompileCuda { device: d, name, source } => match device(ctx, d)? {
            Served::Host { .. } | Served::OpenCl(_) => {
                Err(failed(code::UNSUPPORTED, format!("device {d} is a host device; CUDA kernels need a CUDA device")))
            }
            #[cfg(feature = "cuda")]
            Served::Cuda(c) => {
                let k = c.compile(&name, &source)?;
                o.cuda_kernels.insert((d, name), k);
                Ok(Outcome::Done)
            }
        },
        Command::Record { queue, event } => {
            let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
            if o.events.len() >= limits.max_events as usize && !o.events.contains_key(&event) {
                return Err(failed(code::LIMIT, format!("the session already holds {} events (its limit)", limits.max_events)));
            }
            let launch = o.cl_last.get(&queue).cloned();
            match &launch {
                Some(l) => o.cl_profiles.insert(event, l.clone()),
                None => o.cl_profiles.remove(&event),
            };
            let ev = match device(ctx, d)? {
                Served::Host { .. } => Ev::Done,
                Served::OpenCl(_) => launch.map_or(Ev::Done, Ev::Cl),
                #[cfg(feature = "cuda")]
                Served::Cuda(c) => Ev::Cuda(c.record()?),
            };
            // A peer may wait for it: tell it once complete (CUDA: synchronize first, only when
            // this session is in a mesh).
            #[cfg(feature = "cuda")]
            if let Ev::Cuda(e) = &ev {
                if ctx.in_mesh {
                    crate::cuda::sync_event(e)?;
                }
            }
            o.events.insert(event, ev); // re-recording an event id moves it, as in CUDA
            Ok(Outcome::Done)
        }
        Command::ReleaseEvents { events } => {
            // Unknown ids are no error: an event's Record may have been refused.
            for (event, _) in events {
                o.events.remove(&event);
                o.cl_profiles.remove(&event);
            }
            Ok(Outcome::Done)
        }
        Command::WaitEvent { queue, event } => {
            let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
            let ev = o.events.get(&event).ok_or_else(|| failed(code::INVALID, format!("event {event} does not exist")))?;
            match (device(ctx, d)?, ev) {
                (_, Ev::Done) => Ok(Outcome::Done),
                (_, Ev::Cl(e)) => e.wait("the kernel waited for").map(|_| Outcome::Done),
                #[cfg(feature = "cuda")]
                (Served::Cuda(c), Ev::Cuda(e)) => c.wait_for(e).map(|_| Outcome::Done),
                #[cfg(feature = "cuda")]
                (Served::Host { .. } | Served::OpenCl(_), Ev::Cuda(e)) => crate::cuda::sync_event(e).map(|_| Outcome::Done),
            }
        }
        Command::SyncEvent { event } => {
            match o.events.get(&event).ok_or_else(|| failed(code::INVALID, format!("event {event} does not exist")))? {
                Ev::Done => Ok(Outcome::Done),
                Ev::Cl(e) => e.wait("the kernel waited for").map(|_| Outcome::Done),
                #[cfg(feature = "cuda")]
                Ev::Cuda(e) => crate::cuda::sync_event(e).map(|_| Outcome::Done),
            }
        }
        Command::Finish { queue } => {
            let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
            match device(ctx, d)? {
                Served::Host { .. } => Ok(Outcome::Done),
                // The queue is drained either way: its last kernel's failure is reported once.
                Served::OpenCl(_) => match o.cl_last.remove(&queue) {
                    Some(l) => l.wait("the queue's last kernel").map(|_| Outcome::Done),
                    None => Ok(Outcome::Done),
                },
                #[cfg(feature = "cuda")]
                Served::Cuda(c) => c.synchronize().map(|_| Outcome::Done),
            }
        }
    }
}

pub(super) fn copy(o: &mut Objects, src: u64, src_offset: u64, dst: u64, dst_offset: u64, len: u64) -> Result<Outcome, Outcome> {
    let (sd, sl) = {
        let b = buffer(o, src)?;
        (b.device, b.mem.len())
    };
    let rs = span("copy source", src_offset, len, sl)?;
    let (dd, dl) = {
        let b = buffer(o, dst)?;
        (b.device, b.mem.len())
    };
    let rd = span("copy destination", dst_offset, len, dl)?;
    if sd != dd {
        return Err(failed(code::INVALID, format!("copy between devices {sd} and {dd}: copies stay on one device")));
    }
    if src == dst {
        match &mut buffer(o, src)?.mem {
            Mem::Host(m) => m.bytes_mut().copy_within(rs, rd.start),
            #[cfg(feature = "cuda")]
            Mem::Cuda(m) => m.copy_within(rs, rd.start)?,
            Mem::OpenCl(m) => {
                if rs.start.max(rd.start) < rs.end.min(rd.start + rs.len()) {
                    return Err(failed(code::opencl(-8), "copy: the source and destination regions overlap"));
                }
                m.copy_from(m, rs, rd.start)?;
            }
        }
        return Ok(Outcome::Done);
    }
    let s = o.buffers.remove(&src).expect("checked above");
    let r = match (&s.mem, &mut buffer(o, dst)?.mem) {
        (Mem::Host(a), Mem::Host(b)) => {
            b.bytes_mut()[rd].copy_from_slice(&a.bytes()[rs]);
            Ok(Outcome::Done)
        }
        #[cfg(feature = "cuda")]
        (Mem::Cuda(a), Mem::Cuda(b)) => b.copy_from(a, rs, rd.start).map(|_| Outcome::Done),
        (Mem::OpenCl(a), Mem::OpenCl(b)) => b.copy_from(a, rs, rd.start).map(|_| Outcome::Done),
        _ => Err(failed(code::INVALID, "copy between buffers of different kinds of device")),
    };
    o.buffers.insert(src, s);
    r
}

pub(super) fn launch(ctx: &Ctx, o: &mut Objects, queue: u64, kernel: &str, args: &[Arg], range: u64) -> Result<Outcome, Outcome> {
    let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
    o.stats.launches += 1;
    match device(ctx, d)? {
        Served::Host { .. } => {
            let f = ctx
                .cfg
                .kernels
                .get(kernel)
                .ok_or_else(|| failed(code::KERNEL, format!("no host kernel named `{kernel}` in this daemon")))?;
            // Take each buffer argument out of the session for the call (so each is borrowed once),
            // and put every one back whatever happens.
            let mut taken: Vec<Option<(u64, Buf)>> = Vec::with_capacity(args.len());
            let mut problem = None;
            for (i, a) in args.iter().enumerate() {
                taken.push(None);
                if let Arg::Buffer(id) = a {
                    match o.buffers.remove(id) {
                        Some(b) if b.device == d && matches!(b.mem, Mem::Host(_)) => taken[i] = Some((*id, b)),
                        Some(b) => {
                            problem = Some(format!("argument {i}: buffer {id} lives on device {}, the queue on device {d}", b.device));
                            o.buffers.insert(*id, b);
                        }
                        None if taken.iter().flatten().any(|(t, _)| t == id) => {
                            problem = Some(format!("argument {i}: buffer {id} is passed twice"))
                        }
                        None => problem = Some(format!("argument {i}: buffer {id} does not exist in this session")),
                    }
                }
                if problem.is_some() {
                    break;
                }
            }
            let result = match problem {
                Some(p) => Err(p),
                None => {
                    let mems = taken
                        .iter_mut()
                        .map(|t| match t {
                            Some((_, Buf { mem: Mem::Host(m), .. })) => Some(m),
                            _ => None,
                        })
                        .collect();
                    f(&mut KernelCall::new(args, mems, range))
                }
            };
            for (id, b) in taken.into_iter().flatten() {
                o.buffers.insert(id, b);
            }
            result.map(|_| Outcome::Done).map_err(|e| failed(code::KERNEL, format!("kernel `{kernel}`: {e}")))
        }
        #[cfg(feature = "cuda")]
        Served::Cuda(c) => {
            let mut ptrs = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                ptrs.push(match a {
                    Arg::Buffer(id) => match o.buffers.get(id) {
                        Some(Buf { mem: Mem::Cuda(m), device, .. }) if *device == d => crate::cuda::LaunchArg::Ptr(m.device_ptr()),
                        _ => return Err(failed(code::INVALID, format!("argument {i}: buffer {id} is not a CUDA buffer of device {d}"))),
                    },
                    other => crate::cuda::LaunchArg::Scalar(*other),
                });
            }
            let k = o
                .cuda_kernels
                .get(&(d, kernel.to_string()))
                .ok_or_else(|| failed(code::KERNEL, format!("no CUDA kernel `{kernel}` was compiled on device {d} in this session")))?;
            c.launch(k, &ptrs, range).map(|_| Outcome::Done)
        }
        Served::OpenCl(_) => Err(failed(code::UNSUPPORTED, format!("device {d} is an OpenCL device: its kernels run with ClLaunch"))),
    }
}
