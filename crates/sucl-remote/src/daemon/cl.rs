//! The OpenCL commands of a session: programs built on the server, kernels, NDRange launches
//! and info queries answered by the serving platform.

use super::objects::*;
use crate::opencl::{ClServed, KernelArg};
use crate::wire::{cl_object, cl_query, code, failed, ClArg, Command, Outcome};

fn cl_device<'a>(ctx: &Ctx<'a>, d: u32) -> Result<&'a ClServed, Outcome> {
    match device(ctx, d)? {
        Served::OpenCl(c) => Ok(c),
        _ => Err(failed(code::UNSUPPORTED, format!("device {d} is not an OpenCL device"))),
    }
}

/// Refuses one more program or kernel beyond the session's object limit (its buffer limit).
fn room_for_one(ctx: &Ctx, o: &Objects) -> Result<(), Outcome> {
    let limit = ctx.cfg.limits.max_buffers as usize;
    if o.cl_programs.len() + o.cl_kernels.len() >= limit {
        return Err(failed(code::LIMIT, format!("the session already holds {limit} OpenCL programs and kernels (its limit)")));
    }
    Ok(())
}

fn usize_of(v: u64, what: &str) -> Result<usize, Outcome> {
    usize::try_from(v).map_err(|_| failed(code::INVALID, format!("{what} {v} does not fit this server's size_t")))
}

/// Runs one OpenCL command.
pub(super) fn run(ctx: &Ctx, o: &mut Objects, cmd: Command) -> Result<Outcome, Outcome> {
    match cmd {
        Command::ClBuild { program, device: d, source, options } => {
            let dev = cl_device(ctx, d)?;
            if o.cl_programs.contains_key(&program) {
                return Err(failed(code::INVALID, format!("program {program} already exists")));
            }
            room_for_one(ctx, o)?;
            let (p, error) = dev.build(&source, &options)?;
            o.cl_programs.insert(program, (d, p));
            error.map_or(Ok(Outcome::Done), Err)
        }
        Command::ClCompile { program, device: d, source, options, headers } => {
            let dev = cl_device(ctx, d)?;
            if o.cl_programs.contains_key(&program) {
                return Err(failed(code::INVALID, format!("program {program} already exists")));
            }
            room_for_one(ctx, o)?;
            let (p, error) = dev.compile(&source, &options, &headers)?;
            o.cl_programs.insert(program, (d, p));
            error.map_or(Ok(Outcome::Done), Err)
        }
        Command::ClLink { program, device: d, options, inputs } => {
            let dev = cl_device(ctx, d)?;
            if o.cl_programs.contains_key(&program) {
                return Err(failed(code::INVALID, format!("program {program} already exists")));
            }
            room_for_one(ctx, o)?;
            let mut linked = Vec::with_capacity(inputs.len());
            for id in &inputs {
                match o.cl_programs.get(id) {
                    Some((pd, p)) if *pd == d => linked.push(p),
                    Some((pd, _)) => {
                        return Err(failed(code::opencl(-44), format!("program {id} is of device {pd}, the link is for device {d}")))
                    }
                    None => return Err(failed(code::opencl(-44), format!("program {id} does not exist"))),
                }
            }
            let (p, error) = dev.link(&linked, &options)?;
            if let Some(p) = p {
                o.cl_programs.insert(program, (d, p));
            }
            error.map_or(Ok(Outcome::Done), Err)
        }
        Command::ClKernel { kernel, program, name } => {
            if o.cl_kernels.contains_key(&kernel) {
                return Err(failed(code::INVALID, format!("kernel {kernel} already exists")));
            }
            room_for_one(ctx, o)?;
            let (d, p) =
                o.cl_programs.get(&program).ok_or_else(|| failed(code::opencl(-44), format!("program {program} does not exist")))?;
            let (k, quals) = p.kernel(&name)?;
            // The argument count, each argument's address qualifier, then whether the kernel
            // only reads it (1) or may write it (0).
            let mut answer = (quals.len() as u32).to_le_bytes().to_vec();
            for q in &quals {
                answer.extend_from_slice(&q.to_le_bytes());
            }
            for i in 0..quals.len() {
                answer.extend_from_slice(&u32::from(k.reads_only(i)).to_le_bytes());
            }
            let d = *d;
            o.cl_kernels.insert(kernel, (d, k));
            Ok(Outcome::Data(answer))
        }
        Command::ClRelease { what, id } => {
            let gone = match what {
                cl_object::PROGRAM => o.cl_programs.remove(&id).is_some(),
                _ => o.cl_kernels.remove(&id).is_some(),
            };
            if gone {
                Ok(Outcome::Done)
            } else {
                Err(failed(code::INVALID, format!("OpenCL object {id} does not exist")))
            }
        }
        Command::ClQuery { what, object, device: d, param } => query(ctx, o, what, object, d, param).map(Outcome::Data),
        Command::ClLaunch { queue, kernel, dims, offset, global, local, args } => {
            launch(ctx, o, queue, kernel, dims, offset, global, local, &args)
        }
        other => Err(failed(code::INVALID, format!("{other:?} is not an OpenCL command"))),
    }
}

/// `clGetDeviceInfo(param)` of device `d` as a session sees it: the memory sizes are at most
/// the session's memory limit (`--max-bytes`), which no allocation of the session may pass,
/// so that programs sizing their buffers by the device stay within it; the argument bytes
/// of a kernel at most [`wire::MAX_ARGS`](crate::wire::MAX_ARGS), which a launch carries.
fn device_info(ctx: &Ctx, d: u32, param: u32) -> Result<Vec<u8>, Outcome> {
    let v = cl_device(ctx, d)?.device_info(param)?;
    capped(param, v, ctx.cfg.limits.max_bytes)
}

/// The platform's answer `v` to `clGetDeviceInfo(param)`, capped as [`device_info`] says.
fn capped(param: u32, v: Vec<u8>, max_bytes: u64) -> Result<Vec<u8>, Outcome> {
    const CL_DEVICE_MAX_MEM_ALLOC_SIZE: u32 = 0x1010;
    const CL_DEVICE_MAX_PARAMETER_SIZE: u32 = 0x1017;
    const CL_DEVICE_GLOBAL_MEM_SIZE: u32 = 0x101F;
    let cap = match param {
        CL_DEVICE_MAX_MEM_ALLOC_SIZE | CL_DEVICE_GLOBAL_MEM_SIZE => max_bytes,
        CL_DEVICE_MAX_PARAMETER_SIZE => crate::wire::MAX_ARGS as u64,
        _ => return Ok(v),
    };
    // cl_ulong and size_t (the parameter size) are both 8 bytes on the platforms served.
    let size = u64::from_le_bytes(
        v.get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| failed(code::DEVICE, format!("clGetDeviceInfo({param:#x}) answered {} bytes, not 8", v.len())))?,
    );
    Ok(size.min(cap).to_le_bytes().to_vec())
}

fn query(ctx: &Ctx, o: &mut Objects, what: u8, object: u64, d: u32, param: u32) -> Result<Vec<u8>, Outcome> {
    let no_kernel = || failed(code::opencl(-48), format!("kernel {object} does not exist"));
    match what {
        cl_query::DEVICE => device_info(ctx, d, param),
        cl_query::KERNEL => o.cl_kernels.get(&object).ok_or_else(no_kernel)?.1.info(param),
        cl_query::KERNEL_WORK_GROUP => o.cl_kernels.get(&object).ok_or_else(no_kernel)?.1.work_group_info(param),
        cl_query::KERNEL_ARG => o.cl_kernels.get(&object).ok_or_else(no_kernel)?.1.arg_info(d, param),
        cl_query::PROGRAM_BUILD => o
            .cl_programs
            .get(&object)
            .ok_or_else(|| failed(code::opencl(-44), format!("program {object} does not exist")))?
            .1
            .build_info(param),
        cl_query::PROGRAM => {
            o.cl_programs.get(&object).ok_or_else(|| failed(code::opencl(-44), format!("program {object} does not exist")))?.1.info(param)
        }
        cl_query::EVENT_PROFILE => {
            let launch = o.cl_profiles.get(&object).ok_or_else(|| {
                failed(code::opencl(-7), format!("event {object} has no profiling times (no OpenCL command ran before it)"))
            })?;
            Ok(launch.times("the kernel timed")?.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
        w => Err(failed(code::INVALID, format!("unknown OpenCL query {w}"))),
    }
}

#[allow(clippy::too_many_arguments)]
fn launch(
    ctx: &Ctx,
    o: &mut Objects,
    queue: u64,
    kernel: u64,
    dims: u8,
    offset: [u64; 3],
    global: [u64; 3],
    local: [u64; 3],
    args: &[ClArg],
) -> Result<Outcome, Outcome> {
    let qd = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
    let dev = cl_device(ctx, qd)?;
    let (kd, k) = o.cl_kernels.get(&kernel).ok_or_else(|| failed(code::opencl(-48), format!("kernel {kernel} does not exist")))?;
    if *kd != qd {
        return Err(failed(code::opencl(-34), format!("kernel {kernel} was built for device {kd}, the queue is on device {qd}")));
    }
    let mut kargs = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        kargs.push(match a {
            ClArg::Mem { buffer, offset, len } => {
                let b = o
                    .buffers
                    .get(buffer)
                    .ok_or_else(|| failed(code::opencl(-38), format!("argument {i}: buffer {buffer} does not exist")))?;
                let Mem::OpenCl(m) = &b.mem else {
                    return Err(failed(code::opencl(-38), format!("argument {i}: buffer {buffer} is not an OpenCL buffer")));
                };
                if b.device != qd {
                    return Err(failed(code::opencl(-38), format!("argument {i}: buffer {buffer} lives on device {}", b.device)));
                }
                if *len == 0 && *offset == 0 {
                    KernelArg::Mem(m, None)
                } else {
                    let r = span(&format!("argument {i}"), *offset, *len, m.len())?;
                    KernelArg::Mem(m, Some((r.start, r.len())))
                }
            }
            ClArg::NullMem => KernelArg::NullMem,
            ClArg::Value(v) => KernelArg::Value(v),
            ClArg::Local(n) => KernelArg::Local(usize_of(*n, "a local size")?),
        });
    }
    let three =
        |v: [u64; 3], what| -> Result<[usize; 3], Outcome> { Ok([usize_of(v[0], what)?, usize_of(v[1], what)?, usize_of(v[2], what)?]) };
    let (off, glob, loc) = (three(offset, "an offset")?, three(global, "a global size")?, three(local, "a local size")?);
    let local = (loc != [0; 3]).then_some(&loc);
    let launched = k.launch(dev, &kargs, dims as u32, &off, &glob, local)?;
    o.stats.launches += 1;
    o.cl_last.insert(queue, launched);
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::capped;

    fn answer(param: u32, v: u64, max_bytes: u64) -> u64 {
        u64::from_le_bytes(capped(param, v.to_le_bytes().to_vec(), max_bytes).expect("8 bytes").try_into().expect("8 bytes"))
    }

    #[test]
    fn sizes_a_session_cannot_use_are_capped() {
        // NVIDIA's H100: 80 GB of memory, 32764 bytes of kernel arguments.
        assert_eq!(answer(0x101F, 85_017_493_504, 1 << 30), 1 << 30);
        assert_eq!(answer(0x1010, 21_254_373_376, 1 << 30), 1 << 30);
        assert_eq!(answer(0x1017, 32764, 1 << 30), crate::wire::MAX_ARGS as u64);
        // Below the caps, and other queries, as the platform answers.
        assert_eq!(answer(0x1017, 1024, 1 << 30), 1024);
        assert_eq!(answer(0x101F, 1 << 20, 1 << 30), 1 << 20);
        assert_eq!(answer(0x1002, 132, 1), 132);
        assert!(capped(0x1017, vec![0; 4], 1).is_err());
    }
}
