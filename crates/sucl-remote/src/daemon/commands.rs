//! The commands that work on a session's objects alone, without peers (the OpenCL-only ones
//! in `cl`).

use super::objects::*;
use crate::kernels::{HostMem, KernelCall};
use crate::wire::{self, code, failed, Arg, Command, Outcome};

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
        | Command::ClRelease { .. } => super::cl::run(ctx, o, cmd),
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
