//! The daemon's OpenCL devices: the local OpenCL platforms, loaded at run time through the ICD
//! loader (`libOpenCL.so.1`, opened with `libloading`; nothing is linked, so a daemon without
//! OpenCL builds and runs and simply offers no OpenCL device), as PoCL-R's `pocld` does.
//!
//! Every device gets its own context and two in-order queues with profiling on. Kernels are
//! enqueued on the first and answered at once: the launch's event ([`ClEvent`]) is what a
//! later command waits for. Every other command on the first queue waits for its own work
//! before it is answered (and so, the queue being in order, for every launch before it). The
//! second queue reads a buffer beside running kernels once the buffer's last writing launch is
//! over: a migration out of a device does not wait for kernels that do not write what it sends.

use crate::wire::{code, failed, Outcome};
use std::ffi::{c_char, c_void, CString};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard};

type ClInt = i32;
type Handle = *mut c_void;

/// The name of the sucl OpenCL platform (`libsucl_opencl.so`), which a daemon never serves
/// (it would be a client of itself).
pub(crate) const SUCL_PLATFORM: &str = "sucl";

const CL_SUCCESS: ClInt = 0;
const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
const CL_DEVICE_NAME: u32 = 0x102B;
const CL_DEVICE_GLOBAL_MEM_SIZE: u32 = 0x101F;
const CL_PLATFORM_NAME: u32 = 0x0902;
const CL_QUEUE_PROFILING_ENABLE: u64 = 1 << 1;
const CL_MEM_READ_WRITE: u64 = 1;
const CL_BUFFER_CREATE_TYPE_REGION: u32 = 0x1220;
const CL_PROGRAM_BUILD_LOG: u32 = 0x1183;
const CL_KERNEL_NUM_ARGS: u32 = 0x1191;
const CL_KERNEL_ARG_ADDRESS_QUALIFIER: u32 = 0x1196;
const CL_KERNEL_ARG_ADDRESS_CONSTANT: u32 = 0x119D;
const CL_KERNEL_ARG_TYPE_QUALIFIER: u32 = 0x1199;
const CL_KERNEL_ARG_TYPE_CONST: u64 = 1;
const CL_EVENT_COMMAND_EXECUTION_STATUS: u32 = 0x11D3;
const CL_PROFILING_COMMAND_QUEUED: u32 = 0x1280;
/// The longest answer an info query may have (build logs included).
const MAX_INFO: usize = 1 << 20;

/// The OpenCL entry points the daemon uses, resolved from the loader.
#[allow(clippy::type_complexity)]
struct Api {
    get_platform_ids: unsafe extern "C" fn(u32, *mut Handle, *mut u32) -> ClInt,
    get_platform_info: unsafe extern "C" fn(Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    get_device_ids: unsafe extern "C" fn(Handle, u64, u32, *mut Handle, *mut u32) -> ClInt,
    get_device_info: unsafe extern "C" fn(Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    create_context: unsafe extern "C" fn(*const isize, u32, *const Handle, *const c_void, *mut c_void, *mut ClInt) -> Handle,
    create_command_queue: unsafe extern "C" fn(Handle, Handle, u64, *mut ClInt) -> Handle,
    create_buffer: unsafe extern "C" fn(Handle, u64, usize, *mut c_void, *mut ClInt) -> Handle,
    create_sub_buffer: unsafe extern "C" fn(Handle, u64, u32, *const c_void, *mut ClInt) -> Handle,
    release_mem: unsafe extern "C" fn(Handle) -> ClInt,
    write_buffer: unsafe extern "C" fn(Handle, Handle, u32, usize, usize, *const c_void, u32, *const Handle, *mut Handle) -> ClInt,
    read_buffer: unsafe extern "C" fn(Handle, Handle, u32, usize, usize, *mut c_void, u32, *const Handle, *mut Handle) -> ClInt,
    copy_buffer: unsafe extern "C" fn(Handle, Handle, Handle, usize, usize, usize, u32, *const Handle, *mut Handle) -> ClInt,
    fill_buffer: unsafe extern "C" fn(Handle, Handle, *const c_void, usize, usize, usize, u32, *const Handle, *mut Handle) -> ClInt,
    create_program_with_source: unsafe extern "C" fn(Handle, u32, *const *const c_char, *const usize, *mut ClInt) -> Handle,
    build_program: unsafe extern "C" fn(Handle, u32, *const Handle, *const c_char, *const c_void, *mut c_void) -> ClInt,
    compile_program: unsafe extern "C" fn(
        Handle,
        u32,
        *const Handle,
        *const c_char,
        u32,
        *const Handle,
        *const *const c_char,
        *const c_void,
        *mut c_void,
    ) -> ClInt,
    link_program: unsafe extern "C" fn(
        Handle,
        u32,
        *const Handle,
        *const c_char,
        u32,
        *const Handle,
        *const c_void,
        *mut c_void,
        *mut ClInt,
    ) -> Handle,
    get_program_build_info: unsafe extern "C" fn(Handle, Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    get_program_info: unsafe extern "C" fn(Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    release_program: unsafe extern "C" fn(Handle) -> ClInt,
    create_kernel: unsafe extern "C" fn(Handle, *const c_char, *mut ClInt) -> Handle,
    get_kernel_info: unsafe extern "C" fn(Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    get_kernel_work_group_info: unsafe extern "C" fn(Handle, Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    get_kernel_arg_info: unsafe extern "C" fn(Handle, u32, u32, usize, *mut c_void, *mut usize) -> ClInt,
    release_kernel: unsafe extern "C" fn(Handle) -> ClInt,
    set_kernel_arg: unsafe extern "C" fn(Handle, u32, usize, *const c_void) -> ClInt,
    enqueue_nd_range:
        unsafe extern "C" fn(Handle, Handle, u32, *const usize, *const usize, *const usize, u32, *const Handle, *mut Handle) -> ClInt,
    flush: unsafe extern "C" fn(Handle) -> ClInt,
    wait_for_events: unsafe extern "C" fn(u32, *const Handle) -> ClInt,
    get_event_info: unsafe extern "C" fn(Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    retain_event: unsafe extern "C" fn(Handle) -> ClInt,
    get_event_profiling_info: unsafe extern "C" fn(Handle, u32, usize, *mut c_void, *mut usize) -> ClInt,
    release_event: unsafe extern "C" fn(Handle) -> ClInt,
    _lib: libloading::Library,
}

/// The OpenCL error name of `e`, for messages.
pub(crate) fn error_name(e: ClInt) -> &'static str {
    match e {
        -1 => "CL_DEVICE_NOT_FOUND",
        -2 => "CL_DEVICE_NOT_AVAILABLE",
        -4 => "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        -5 => "CL_OUT_OF_RESOURCES",
        -6 => "CL_OUT_OF_HOST_MEMORY",
        -11 => "CL_BUILD_PROGRAM_FAILURE",
        -13 => "CL_MISALIGNED_SUB_BUFFER_OFFSET",
        -15 => "CL_COMPILE_PROGRAM_FAILURE",
        -17 => "CL_LINK_PROGRAM_FAILURE",
        -30 => "CL_INVALID_VALUE",
        -33 => "CL_INVALID_DEVICE",
        -38 => "CL_INVALID_MEM_OBJECT",
        -43 => "CL_INVALID_BUILD_OPTIONS",
        -66 => "CL_INVALID_COMPILER_OPTIONS",
        -67 => "CL_INVALID_LINKER_OPTIONS",
        -44 => "CL_INVALID_PROGRAM",
        -45 => "CL_INVALID_PROGRAM_EXECUTABLE",
        -46 => "CL_INVALID_KERNEL_NAME",
        -48 => "CL_INVALID_KERNEL",
        -49 => "CL_INVALID_ARG_INDEX",
        -50 => "CL_INVALID_ARG_VALUE",
        -51 => "CL_INVALID_ARG_SIZE",
        -52 => "CL_INVALID_KERNEL_ARGS",
        -53 => "CL_INVALID_WORK_DIMENSION",
        -54 => "CL_INVALID_WORK_GROUP_SIZE",
        -55 => "CL_INVALID_WORK_ITEM_SIZE",
        -56 => "CL_INVALID_GLOBAL_OFFSET",
        -63 => "CL_INVALID_GLOBAL_WORK_SIZE",
        _ => "an OpenCL error",
    }
}

/// `Err(Outcome)` carrying OpenCL error `e` unless it is success.
fn check(e: ClInt, what: &str) -> Result<(), Outcome> {
    if e == CL_SUCCESS {
        Ok(())
    } else {
        Err(failed(code::opencl(e), format!("{what}: {} ({e})", error_name(e))))
    }
}

impl Api {
    fn load() -> Result<Api, String> {
        // SAFETY: loading the system's ICD loader runs its initializers; it is the library
        // every OpenCL program loads, made for exactly this.
        let lib = unsafe { libloading::Library::new("libOpenCL.so.1") }.map_err(|e| format!("cannot load libOpenCL.so.1: {e}"))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the OpenCL 1.2 entry point of that name, whose C
                // signature the field's type repeats; the library outlives the pointer (it is
                // kept in `_lib`).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("libOpenCL.so.1 lacks {}: {e}", $name))?
            };
        }
        Ok(Api {
            get_platform_ids: sym!("clGetPlatformIDs"),
            get_platform_info: sym!("clGetPlatformInfo"),
            get_device_ids: sym!("clGetDeviceIDs"),
            get_device_info: sym!("clGetDeviceInfo"),
            create_context: sym!("clCreateContext"),
            create_command_queue: sym!("clCreateCommandQueue"),
            create_buffer: sym!("clCreateBuffer"),
            create_sub_buffer: sym!("clCreateSubBuffer"),
            release_mem: sym!("clReleaseMemObject"),
            write_buffer: sym!("clEnqueueWriteBuffer"),
            read_buffer: sym!("clEnqueueReadBuffer"),
            copy_buffer: sym!("clEnqueueCopyBuffer"),
            fill_buffer: sym!("clEnqueueFillBuffer"),
            create_program_with_source: sym!("clCreateProgramWithSource"),
            build_program: sym!("clBuildProgram"),
            compile_program: sym!("clCompileProgram"),
            link_program: sym!("clLinkProgram"),
            get_program_build_info: sym!("clGetProgramBuildInfo"),
            get_program_info: sym!("clGetProgramInfo"),
            release_program: sym!("clReleaseProgram"),
            create_kernel: sym!("clCreateKernel"),
            get_kernel_info: sym!("clGetKernelInfo"),
            get_kernel_work_group_info: sym!("clGetKernelWorkGroupInfo"),
            get_kernel_arg_info: sym!("clGetKernelArgInfo"),
            release_kernel: sym!("clReleaseKernel"),
            set_kernel_arg: sym!("clSetKernelArg"),
            enqueue_nd_range: sym!("clEnqueueNDRangeKernel"),
            flush: sym!("clFlush"),
            wait_for_events: sym!("clWaitForEvents"),
            get_event_info: sym!("clGetEventInfo"),
            retain_event: sym!("clRetainEvent"),
            get_event_profiling_info: sym!("clGetEventProfilingInfo"),
            release_event: sym!("clReleaseEvent"),
            _lib: lib,
        })
    }
}

/// Reads an info value with the usual two calls (size, then bytes), refusing answers over
/// [`MAX_INFO`].
fn info(what: &str, f: impl Fn(usize, *mut c_void, *mut usize) -> ClInt) -> Result<Vec<u8>, Outcome> {
    let mut size = 0usize;
    check(f(0, ptr::null_mut(), &mut size), what)?;
    if size > MAX_INFO {
        return Err(failed(code::DEVICE, format!("{what}: the platform's answer of {size} bytes is over {MAX_INFO}")));
    }
    let mut v = vec![0u8; size];
    check(f(size, v.as_mut_ptr().cast(), ptr::null_mut()), what)?;
    Ok(v)
}

/// A NUL-terminated info string as Rust text.
fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

/// One OpenCL device the daemon serves, with its context and queues.
pub(crate) struct ClServed {
    api: Arc<Api>,
    device: Handle,
    context: Handle,
    /// Kernels and every command but the reads beside them.
    queue: Handle,
    /// Reads of buffers whose last writing launch is over, beside the kernels on `queue`.
    beside: Handle,
    name: String,
    memory: u64,
}

// SAFETY: OpenCL 1.2 object handles may be used from any thread, and every API call the
// daemon makes on them is thread-safe (clSetKernelArg, the exception, is called only on a
// session's own kernels, under the session's object lock).
unsafe impl Send for ClServed {}
// SAFETY: as for Send: the handles are only passed to thread-safe OpenCL calls.
unsafe impl Sync for ClServed {}

/// The OpenCL devices of every local platform (none when no loader or platform is present),
/// skipping platforms whose name is in `skip` (the sucl platform itself).
pub(crate) fn open_all(skip: &[&str]) -> Result<Vec<ClServed>, String> {
    let api = Arc::new(Api::load()?);
    let mut n = 0u32;
    // SAFETY: a count query with no output array, as the specification allows.
    let e = unsafe { (api.get_platform_ids)(0, ptr::null_mut(), &mut n) };
    if e != CL_SUCCESS || n == 0 {
        return Ok(Vec::new()); // -1001 (no ICD): no platform
    }
    let mut platforms = vec![ptr::null_mut(); n as usize];
    // SAFETY: `platforms` has room for `n` handles.
    check(unsafe { (api.get_platform_ids)(n, platforms.as_mut_ptr(), ptr::null_mut()) }, "clGetPlatformIDs").map_err(describe)?;
    let mut out = Vec::new();
    for p in platforms {
        // SAFETY: `p` is a platform the loader returned; the closure passes `info`'s buffer.
        let name =
            text(&info("clGetPlatformInfo", |s, v, r| unsafe { (api.get_platform_info)(p, CL_PLATFORM_NAME, s, v, r) }).map_err(describe)?);
        if skip.contains(&name.as_str()) {
            continue;
        }
        let mut nd = 0u32;
        // SAFETY: a count query on a valid platform.
        if unsafe { (api.get_device_ids)(p, CL_DEVICE_TYPE_ALL, 0, ptr::null_mut(), &mut nd) } != CL_SUCCESS {
            continue;
        }
        let mut devs = vec![ptr::null_mut(); nd as usize];
        // SAFETY: `devs` has room for `nd` handles.
        check(unsafe { (api.get_device_ids)(p, CL_DEVICE_TYPE_ALL, nd, devs.as_mut_ptr(), ptr::null_mut()) }, "clGetDeviceIDs")
            .map_err(describe)?;
        for d in devs {
            out.push(ClServed::open(&api, d, &name).map_err(describe)?);
        }
    }
    Ok(out)
}

fn describe(o: Outcome) -> String {
    match o {
        Outcome::Failed { message, .. } => message,
        other => format!("{other:?}"),
    }
}

impl ClServed {
    fn open(api: &Arc<Api>, device: Handle, platform: &str) -> Result<ClServed, Outcome> {
        let mut e = 0;
        // SAFETY: one valid device, no properties, no callback.
        let context = unsafe { (api.create_context)(ptr::null(), 1, &device, ptr::null(), ptr::null_mut(), &mut e) };
        check(e, "clCreateContext")?;
        // SAFETY: a valid context and device of it.
        let queue = unsafe { (api.create_command_queue)(context, device, CL_QUEUE_PROFILING_ENABLE, &mut e) };
        if let Err(o) = check(e, "clCreateCommandQueue") {
            // SAFETY: the context was made above and nothing else holds it.
            unsafe { release_queues_and_context(api, &[], context) };
            return Err(o);
        }
        // SAFETY: as above.
        let beside = unsafe { (api.create_command_queue)(context, device, 0, &mut e) };
        if let Err(o) = check(e, "clCreateCommandQueue") {
            // SAFETY: the queue and context were made above and nothing else holds them.
            unsafe { release_queues_and_context(api, &[queue], context) };
            return Err(o);
        }
        let mut s = ClServed { api: api.clone(), device, context, queue, beside, name: String::new(), memory: 0 };
        s.name = format!("{} ({platform})", text(&s.device_info(CL_DEVICE_NAME)?));
        let m = s.device_info(CL_DEVICE_GLOBAL_MEM_SIZE)?;
        s.memory = u64::from_le_bytes(m.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default());
        Ok(s)
    }

    pub(crate) fn info(&self) -> crate::wire::DeviceInfo {
        crate::wire::DeviceInfo { kind: crate::wire::DeviceKind::OpenCl, name: self.name.clone(), memory: self.memory }
    }

    /// `clGetDeviceInfo(param)` as the platform answers it.
    pub(crate) fn device_info(&self, param: u32) -> Result<Vec<u8>, Outcome> {
        // SAFETY: a valid device; `info` passes a buffer of the size it says.
        info("clGetDeviceInfo", |s, v, r| unsafe { (self.api.get_device_info)(self.device, param, s, v, r) })
    }

    /// A zeroed buffer of `bytes` bytes.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<ClMem, Outcome> {
        let mut e = 0;
        // SAFETY: a valid context; no host pointer.
        let mem = unsafe { (self.api.create_buffer)(self.context, CL_MEM_READ_WRITE, bytes.max(1), ptr::null_mut(), &mut e) };
        check(e, "clCreateBuffer")?;
        let m = ClMem { api: self.api.clone(), queue: self.queue, beside: self.beside, mem, len: bytes, last_write: Mutex::new(None) };
        if bytes > 0 {
            m.fill(0..bytes, &[0])?;
        }
        Ok(m)
    }

    /// Runs `enqueue` (which gets the event to fill), waits for its event and returns the
    /// command's four profiling times.
    fn run(api: &Api, what: &str, enqueue: impl FnOnce(*mut Handle) -> ClInt) -> Result<[u64; 4], Outcome> {
        let mut ev: Handle = ptr::null_mut();
        check(enqueue(&mut ev), what)?;
        // SAFETY: `ev` is the event the enqueue just returned.
        let waited = unsafe { (api.wait_for_events)(1, &ev) };
        let times = profile(api, ev);
        // SAFETY: the event is ours to release, once.
        unsafe { (api.release_event)(ev) };
        check(waited, what)?;
        Ok(times)
    }

    /// Builds `source` with `options`: the program (kept whether or not the build succeeded)
    /// and the build's error, if it failed.
    pub(crate) fn build(&self, source: &str, options: &str) -> Result<(ClProgram, Option<Outcome>), Outcome> {
        // Argument qualifiers are asked for when kernels are made (PoCL answers them only
        // for programs built with this option).
        let (prog, e) = self.build_once(source, &with_arg_info(options))?;
        if e != CL_SUCCESS && !options.contains(ARG_INFO) {
            // NVIDIA's compiler (CUDA 13.0) makes PTX its assembler rejects for a kernel
            // without arguments when asked for argument info: built as the application
            // asked, the program has no argument info (the client copes, as with PoCL's
            // linked programs), and a failure's log is the application's own.
            let (retry, e) = self.build_once(source, options)?;
            return Ok(retry.outcome(e, "clBuildProgram"));
        }
        Ok(prog.outcome(e, "clBuildProgram"))
    }

    /// One `clBuildProgram` of `source` with exactly `options`: the program and its status.
    fn build_once(&self, source: &str, options: &str) -> Result<(ClProgram, ClInt), Outcome> {
        let opts = CString::new(options).map_err(|_| failed(code::opencl(-43), "the build options hold a NUL byte"))?;
        let prog = self.program_from(source)?;
        // SAFETY: a valid program for this device; options NUL-terminated; no callback.
        let e = unsafe { (self.api.build_program)(prog.program, 1, &self.device, opts.as_ptr(), ptr::null(), ptr::null_mut()) };
        Ok((prog, e))
    }

    /// A program from `source` (on this device's context).
    fn program_from(&self, source: &str) -> Result<ClProgram, Outcome> {
        let src = CString::new(source).map_err(|_| failed(code::opencl(-30), "an OpenCL source holds a NUL byte"))?;
        let mut e = 0;
        let p = src.as_ptr();
        // SAFETY: one NUL-terminated source string (lengths null: NUL-terminated).
        let program = unsafe { (self.api.create_program_with_source)(self.context, 1, &p, ptr::null(), &mut e) };
        check(e, "clCreateProgramWithSource")?;
        Ok(ClProgram { api: self.api.clone(), program, device: self.device })
    }

    /// Compiles `source` with `options` and the embedded `headers` (include name, source)
    /// into a compiled object: the program (kept whether or not it compiled) and the
    /// compilation's error, if it failed.
    pub(crate) fn compile(
        &self,
        source: &str,
        options: &str,
        headers: &[(String, String)],
    ) -> Result<(ClProgram, Option<Outcome>), Outcome> {
        // As for `build`: the argument qualifiers come from the compilation, and a failure
        // with them asked for is tried again as the application asked.
        let (prog, e) = self.compile_once(source, &with_arg_info(options), headers)?;
        if e != CL_SUCCESS && !options.contains(ARG_INFO) {
            let (retry, e) = self.compile_once(source, options, headers)?;
            return Ok(retry.outcome(e, "clCompileProgram"));
        }
        Ok(prog.outcome(e, "clCompileProgram"))
    }

    /// One `clCompileProgram` of `source` with exactly `options` and `headers`: the
    /// program and its status (a failure other than the compilation's own is an error).
    fn compile_once(&self, source: &str, options: &str, headers: &[(String, String)]) -> Result<(ClProgram, ClInt), Outcome> {
        let opts = CString::new(options).map_err(|_| failed(code::opencl(-66), "the compile options hold a NUL byte"))?;
        let names = headers
            .iter()
            .map(|(n, _)| CString::new(n.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| failed(code::opencl(-30), "a header name holds a NUL byte"))?;
        // The header programs live until the compilation is over (dropped at the end).
        let header_programs = headers.iter().map(|(_, src)| self.program_from(src)).collect::<Result<Vec<_>, _>>()?;
        let prog = self.program_from(source)?;
        let handles: Vec<Handle> = header_programs.iter().map(|p| p.program).collect();
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let (hp, np) = if headers.is_empty() { (ptr::null(), ptr::null()) } else { (handles.as_ptr(), name_ptrs.as_ptr()) };
        // SAFETY: a valid program for this device; options and names NUL-terminated; the
        // header programs and names (as many as `headers`) live through the call; no callback.
        let e = unsafe {
            (self.api.compile_program)(
                prog.program,
                1,
                &self.device,
                opts.as_ptr(),
                headers.len() as u32,
                hp,
                np,
                ptr::null(),
                ptr::null_mut(),
            )
        };
        if e != CL_SUCCESS && e != -15 {
            // Bad options and the like: no compiled program to keep.
            check(e, "clCompileProgram")?;
        }
        Ok((prog, e))
    }

    /// Links `inputs` (compiled objects and libraries of this device) with `options`: the
    /// program, if the platform made one (a failed link may leave one, with its log), and the
    /// link's error, if it failed.
    pub(crate) fn link(&self, inputs: &[&ClProgram], options: &str) -> Result<(Option<ClProgram>, Option<Outcome>), Outcome> {
        let opts = CString::new(options).map_err(|_| failed(code::opencl(-67), "the link options hold a NUL byte"))?;
        let handles: Vec<Handle> = inputs.iter().map(|p| p.program).collect();
        let mut e = 0;
        // SAFETY: a valid context and device; `handles` are valid programs of this context
        // (the session's, alive through the call); options NUL-terminated; no callback.
        let program = unsafe {
            (self.api.link_program)(
                self.context,
                1,
                &self.device,
                opts.as_ptr(),
                handles.len() as u32,
                handles.as_ptr(),
                ptr::null(),
                ptr::null_mut(),
                &mut e,
            )
        };
        if program.is_null() {
            check(e, "clLinkProgram")?;
            return Err(failed(code::opencl(-17), "clLinkProgram returned no program"));
        }
        let prog = ClProgram { api: self.api.clone(), program, device: self.device };
        let (prog, error) = prog.outcome(e, "clLinkProgram");
        Ok((Some(prog), error))
    }
}

impl Drop for ClServed {
    fn drop(&mut self) {
        // SAFETY: the queues and context were created by `open` and are released once.
        unsafe { release_queues_and_context(&self.api, &[self.queue, self.beside], self.context) };
    }
}

/// Releases queues and a context through the loader (entry points looked up on demand: they
/// are needed once, when the daemon stops).
///
/// # Safety
/// `queues` and `context` are valid and not used afterwards.
unsafe fn release_queues_and_context(api: &Api, queues: &[Handle], context: Handle) {
    type Release = unsafe extern "C" fn(Handle) -> ClInt;
    // SAFETY: the symbols are the OpenCL release functions of these objects.
    unsafe {
        if let Ok(f) = api._lib.get::<Release>(b"clReleaseCommandQueue\0") {
            for q in queues {
                f(*q);
            }
        }
        if let Ok(f) = api._lib.get::<Release>(b"clReleaseContext\0") {
            f(context);
        }
    }
}

/// The option that makes a platform keep kernel argument info.
const ARG_INFO: &str = "-cl-kernel-arg-info";

/// `options` with [`ARG_INFO`] added where it is not there.
fn with_arg_info(options: &str) -> String {
    if options.contains(ARG_INFO) {
        options.to_string()
    } else {
        format!("{options} {ARG_INFO}")
    }
}

/// The last writing launch of a buffer, locked even after a panicked holder (a panic in one
/// session's thread must not take the daemon down).
fn last_write(m: &Mutex<Option<ClEvent>>) -> MutexGuard<'_, Option<ClEvent>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The event of a command enqueued without waiting (a launch): held (retained) until dropped.
pub(crate) struct ClEvent {
    api: Arc<Api>,
    event: Handle,
}

// SAFETY: see ClServed: an event handle is used only in thread-safe OpenCL calls.
unsafe impl Send for ClEvent {}
// SAFETY: as for Send.
unsafe impl Sync for ClEvent {}

impl Clone for ClEvent {
    fn clone(&self) -> ClEvent {
        // SAFETY: a valid event, retained once more for the clone (released by its drop).
        unsafe { (self.api.retain_event)(self.event) };
        ClEvent { api: self.api.clone(), event: self.event }
    }
}

impl Drop for ClEvent {
    fn drop(&mut self) {
        // SAFETY: this handle's one reference, released once.
        unsafe { (self.api.release_event)(self.event) };
    }
}

impl ClEvent {
    /// Waits until the command is over; an error if it failed (`what` names it).
    pub(crate) fn wait(&self, what: &str) -> Result<(), Outcome> {
        // SAFETY: a valid event.
        let waited = unsafe { (self.api.wait_for_events)(1, &self.event) };
        match self.status() {
            s if s < 0 => Err(failed(code::opencl(s), format!("{what} failed on the device: {} ({s})", error_name(s)))),
            _ => check(waited, what),
        }
    }

    /// Whether the command is over (complete or failed), without waiting.
    pub(crate) fn over(&self) -> bool {
        self.status() <= 0
    }

    /// `CL_EVENT_COMMAND_EXECUTION_STATUS` (0 complete, negative failed); an unanswered query
    /// reads as a failure.
    fn status(&self) -> ClInt {
        let mut st: ClInt = -5;
        // SAFETY: a valid event; the output is one cl_int.
        let e = unsafe {
            (self.api.get_event_info)(self.event, CL_EVENT_COMMAND_EXECUTION_STATUS, 4, (&mut st as *mut ClInt).cast(), ptr::null_mut())
        };
        if e == CL_SUCCESS {
            st
        } else {
            e
        }
    }

    /// The command's four profiling times (queued, submitted, started, ended), once it is over.
    pub(crate) fn times(&self, what: &str) -> Result<[u64; 4], Outcome> {
        self.wait(what)?;
        Ok(profile(&self.api, self.event))
    }
}

/// The four profiling times of `ev` (zeros where the platform answers none).
fn profile(api: &Api, ev: Handle) -> [u64; 4] {
    let mut times = [0u64; 4];
    for (i, t) in times.iter_mut().enumerate() {
        // SAFETY: a valid event; the output is one u64.
        unsafe { (api.get_event_profiling_info)(ev, CL_PROFILING_COMMAND_QUEUED + i as u32, 8, (t as *mut u64).cast(), ptr::null_mut()) };
    }
    times
}

/// A buffer on an OpenCL device.
pub(crate) struct ClMem {
    api: Arc<Api>,
    queue: Handle,
    /// The device's queue for reads beside kernels.
    beside: Handle,
    mem: Handle,
    len: usize,
    /// The last launch given this buffer as an argument it may write (not `const`).
    last_write: Mutex<Option<ClEvent>>,
}

// SAFETY: see ClServed: the handles are used only in thread-safe OpenCL calls.
unsafe impl Send for ClMem {}
// SAFETY: as for Send.
unsafe impl Sync for ClMem {}

impl ClMem {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// After a blocking command wrote this buffer on the first queue: every launch before it is
    /// over, so no earlier kernel (nor its failure) is the buffer's last writer any more.
    fn written(&self, done: Result<[u64; 4], Outcome>) -> Result<[u64; 4], Outcome> {
        if done.is_ok() {
            *last_write(&self.last_write) = None;
        }
        done
    }

    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<[u64; 4], Outcome> {
        // SAFETY: the range was checked against the buffer by the caller; `data` lives
        // through the blocking wait inside `run`.
        self.written(ClServed::run(&self.api, "clEnqueueWriteBuffer", |ev| unsafe {
            (self.api.write_buffer)(self.queue, self.mem, 0, offset, data.len(), data.as_ptr().cast(), 0, ptr::null(), ev)
        }))
    }

    /// Bytes `r` as the commands before this one left them: read on the device's second
    /// queue, beside the kernels on the first, once the last launch that may write this buffer
    /// is over (a kernel that only reads it may still run: reads do not conflict).
    pub(crate) fn read(&self, r: std::ops::Range<usize>) -> Result<(Vec<u8>, [u64; 4]), Outcome> {
        let writer = last_write(&self.last_write).clone();
        if let Some(w) = writer {
            w.wait("the kernel that last wrote the buffer")?;
        }
        self.read_on(self.beside, r)
    }

    fn read_on(&self, queue: Handle, r: std::ops::Range<usize>) -> Result<(Vec<u8>, [u64; 4]), Outcome> {
        // Not zeroed first: the platform writes every byte (a pass over the data saved).
        let mut v = Vec::<u8>::with_capacity(r.len());
        // SAFETY: the range was checked by the caller; `v` has room for `r.len()` bytes and
        // lives through the wait inside `run`.
        let t = ClServed::run(&self.api, "clEnqueueReadBuffer", |ev| unsafe {
            (self.api.read_buffer)(queue, self.mem, 0, r.start, r.len(), v.as_mut_ptr().cast(), 0, ptr::null(), ev)
        })?;
        // SAFETY: the blocking read completed without error (`run` waited for its event and
        // checked its status), so the platform wrote all `r.len()` bytes.
        unsafe { v.set_len(r.len()) };
        Ok((v, t))
    }

    pub(crate) fn fill(&self, r: std::ops::Range<usize>, pattern: &[u8]) -> Result<[u64; 4], Outcome> {
        if r.is_empty() {
            return Ok([0; 4]);
        }
        // OpenCL fills with patterns of 1, 2, 4, ..., 128 bytes at aligned offsets; others
        // are written as bytes.
        if !pattern.len().is_power_of_two() || pattern.len() > 128 || !r.start.is_multiple_of(pattern.len()) {
            let data: Vec<u8> = pattern.iter().copied().cycle().take(r.len()).collect();
            return self.write(r.start, &data);
        }
        // SAFETY: the range was checked; the pattern outlives the wait.
        self.written(ClServed::run(&self.api, "clEnqueueFillBuffer", |ev| unsafe {
            (self.api.fill_buffer)(self.queue, self.mem, pattern.as_ptr().cast(), pattern.len(), r.start, r.len(), 0, ptr::null(), ev)
        }))
    }

    /// Copies `src[rs]` to `self` at `at` (both on this device; overlap within one buffer is
    /// the caller's to avoid).
    pub(crate) fn copy_from(&self, src: &ClMem, rs: std::ops::Range<usize>, at: usize) -> Result<[u64; 4], Outcome> {
        if rs.is_empty() {
            return Ok([0; 4]);
        }
        // SAFETY: both ranges were checked by the caller.
        self.written(ClServed::run(&self.api, "clEnqueueCopyBuffer", |ev| unsafe {
            (self.api.copy_buffer)(self.queue, src.mem, self.mem, rs.start, at, rs.len(), 0, ptr::null(), ev)
        }))
    }

    /// A sub-buffer for bytes `offset..offset + len`.
    fn sub(&self, offset: usize, len: usize) -> Result<Handle, Outcome> {
        let region = [offset, len];
        let mut e = 0;
        // SAFETY: `region` is a cl_buffer_region (origin, size) that lives through the call.
        let m = unsafe {
            (self.api.create_sub_buffer)(self.mem, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, region.as_ptr().cast(), &mut e)
        };
        check(e, "clCreateSubBuffer")?;
        Ok(m)
    }
}

impl Drop for ClMem {
    fn drop(&mut self) {
        // SAFETY: the buffer was created by this module and is released once.
        unsafe { (self.api.release_mem)(self.mem) };
    }
}

/// A program built on one device.
pub(crate) struct ClProgram {
    api: Arc<Api>,
    program: Handle,
    device: Handle,
}

// SAFETY: see ClServed.
unsafe impl Send for ClProgram {}
// SAFETY: as for Send.
unsafe impl Sync for ClProgram {}

impl ClProgram {
    /// This program with the error of the build, compilation or link (`what`) that
    /// returned `e`, if it failed: its code, and the program's log as the message.
    fn outcome(self, e: ClInt, what: &str) -> (ClProgram, Option<Outcome>) {
        if e == CL_SUCCESS {
            return (self, None);
        }
        let log = self.build_info(CL_PROGRAM_BUILD_LOG).map(|l| text(&l)).unwrap_or_default();
        let mut log: String = log.chars().take(3800).collect();
        if log.is_empty() {
            log = format!("{what}: {} ({e})", error_name(e));
        }
        (self, Some(failed(code::opencl(e), log)))
    }

    pub(crate) fn build_info(&self, param: u32) -> Result<Vec<u8>, Outcome> {
        // SAFETY: a valid program and device; `info` passes a buffer of the size it says.
        info("clGetProgramBuildInfo", |s, v, r| unsafe { (self.api.get_program_build_info)(self.program, self.device, param, s, v, r) })
    }

    /// `clGetProgramInfo(param)`; parameters that answer handles are refused (they mean
    /// nothing to a client).
    pub(crate) fn info(&self, param: u32) -> Result<Vec<u8>, Outcome> {
        const CL_PROGRAM_CONTEXT: u32 = 0x1161;
        const CL_PROGRAM_DEVICES: u32 = 0x1163;
        const CL_PROGRAM_BINARIES: u32 = 0x1166;
        if [CL_PROGRAM_CONTEXT, CL_PROGRAM_DEVICES, CL_PROGRAM_BINARIES].contains(&param) {
            return Err(failed(code::opencl(-30), format!("program info {param:#x} answers pointers")));
        }
        // SAFETY: a valid program; `info` passes a buffer of the size it says.
        info("clGetProgramInfo", |s, v, r| unsafe { (self.api.get_program_info)(self.program, param, s, v, r) })
    }

    /// Kernel `name` of this (built) program, with each argument's address qualifier.
    pub(crate) fn kernel(&self, name: &str) -> Result<(ClKernel, Vec<u32>), Outcome> {
        let n = CString::new(name).map_err(|_| failed(code::opencl(-46), "a kernel name holds a NUL byte"))?;
        let mut e = 0;
        // SAFETY: a valid program and a NUL-terminated name.
        let kernel = unsafe { (self.api.create_kernel)(self.program, n.as_ptr(), &mut e) };
        check(e, &format!("clCreateKernel `{name}`"))?;
        let mut k = ClKernel { api: self.api.clone(), kernel, device: self.device, read_only: Vec::new() };
        let count = k.info(CL_KERNEL_NUM_ARGS)?;
        let count = u32::from_le_bytes(count.get(..4).and_then(|b| b.try_into().ok()).unwrap_or_default());
        let number = |i: u32, param: u32| -> Option<u64> {
            let v = k.arg_info(i, param).ok()?;
            match v.len() {
                4 => Some(u32::from_le_bytes(v[..4].try_into().ok()?) as u64),
                8 => Some(u64::from_le_bytes(v[..8].try_into().ok()?)),
                _ => None,
            }
        };
        let count = count.min(crate::wire::MAX_ARGS as u32);
        let quals: Vec<u32> = (0..count).map(|i| number(i, CL_KERNEL_ARG_ADDRESS_QUALIFIER).unwrap_or(0) as u32).collect();
        // A `__constant` argument, or a pointer to `const`, is never written by the kernel.
        // Without argument info (a program built without it) every argument may be written.
        k.read_only = (0..count)
            .map(|i| {
                quals[i as usize] == CL_KERNEL_ARG_ADDRESS_CONSTANT
                    || number(i, CL_KERNEL_ARG_TYPE_QUALIFIER).is_some_and(|t| t & CL_KERNEL_ARG_TYPE_CONST != 0)
            })
            .collect();
        Ok((k, quals))
    }
}

impl Drop for ClProgram {
    fn drop(&mut self) {
        // SAFETY: released once.
        unsafe { (self.api.release_program)(self.program) };
    }
}

/// A kernel of a built program.
pub(crate) struct ClKernel {
    api: Arc<Api>,
    kernel: Handle,
    device: Handle,
    /// Per argument: whether the kernel only reads it (`__constant`, or a pointer to `const`).
    read_only: Vec<bool>,
}

// SAFETY: see ClServed; arguments are set only under the owning session's lock.
unsafe impl Send for ClKernel {}
// SAFETY: as for Send.
unsafe impl Sync for ClKernel {}

/// One argument as the platform takes it.
pub(crate) enum KernelArg<'a> {
    /// A buffer, or a part of one (offset, length).
    Mem(&'a ClMem, Option<(usize, usize)>),
    NullMem,
    Value(&'a [u8]),
    Local(usize),
}

impl ClKernel {
    pub(crate) fn info(&self, param: u32) -> Result<Vec<u8>, Outcome> {
        // SAFETY: a valid kernel; `info` passes a buffer of the size it says.
        info("clGetKernelInfo", |s, v, r| unsafe { (self.api.get_kernel_info)(self.kernel, param, s, v, r) })
    }

    pub(crate) fn work_group_info(&self, param: u32) -> Result<Vec<u8>, Outcome> {
        // SAFETY: a valid kernel and its device.
        info("clGetKernelWorkGroupInfo", |s, v, r| unsafe {
            (self.api.get_kernel_work_group_info)(self.kernel, self.device, param, s, v, r)
        })
    }

    pub(crate) fn arg_info(&self, index: u32, param: u32) -> Result<Vec<u8>, Outcome> {
        // SAFETY: a valid kernel; an out-of-range index is the platform's to refuse.
        info("clGetKernelArgInfo", |s, v, r| unsafe { (self.api.get_kernel_arg_info)(self.kernel, index, param, s, v, r) })
    }

    /// Whether argument `index` is one the kernel never writes.
    pub(crate) fn reads_only(&self, index: usize) -> bool {
        self.read_only.get(index).copied().unwrap_or(false)
    }

    /// Sets every argument and enqueues the NDRange on `device`'s queue, without waiting for
    /// it: its event, which each buffer the kernel may write keeps as its last writer.
    pub(crate) fn launch(
        &self,
        device: &ClServed,
        args: &[KernelArg],
        dims: u32,
        offset: &[usize; 3],
        global: &[usize; 3],
        local: Option<&[usize; 3]>,
    ) -> Result<ClEvent, Outcome> {
        let mut subs = Vec::new();
        let r = self.set_args(args, &mut subs).and_then(|_| {
            let mut ev: Handle = ptr::null_mut();
            // SAFETY: a valid queue and kernel; the size arrays have 3 entries, of which the
            // platform reads `dims`.
            let e = unsafe {
                (self.api.enqueue_nd_range)(
                    device.queue,
                    self.kernel,
                    dims,
                    offset.as_ptr(),
                    global.as_ptr(),
                    local.map_or(ptr::null(), |l| l.as_ptr()),
                    0,
                    ptr::null(),
                    &mut ev,
                )
            };
            check(e, "clEnqueueNDRangeKernel")?;
            // Submitted now, not at the next blocking call: nothing else may come for a while.
            // SAFETY: a valid queue.
            unsafe { (self.api.flush)(device.queue) };
            Ok(ClEvent { api: self.api.clone(), event: ev })
        });
        for m in subs {
            // SAFETY: the sub-buffers made for this launch, released once enqueued (the
            // platform keeps them for the command that uses them).
            unsafe { (self.api.release_mem)(m) };
        }
        let ev = r?;
        for (i, a) in args.iter().enumerate() {
            if let KernelArg::Mem(m, _) = a {
                if !self.reads_only(i) {
                    *last_write(&m.last_write) = Some(ev.clone());
                }
            }
        }
        Ok(ev)
    }

    fn set_args(&self, args: &[KernelArg], subs: &mut Vec<Handle>) -> Result<(), Outcome> {
        for (i, a) in args.iter().enumerate() {
            let what = format!("clSetKernelArg {i}");
            let i = i as u32;
            // SAFETY: each value pointer points at `size` readable bytes that live through
            // the call (the platform copies them); a null value with a size is a __local one.
            let e = unsafe {
                match a {
                    KernelArg::Mem(m, None) => (self.api.set_kernel_arg)(self.kernel, i, 8, (&m.mem as *const Handle).cast()),
                    KernelArg::Mem(m, Some((off, len))) => {
                        let s = m.sub(*off, *len)?;
                        subs.push(s);
                        (self.api.set_kernel_arg)(self.kernel, i, 8, (subs.last().expect("pushed") as *const Handle).cast())
                    }
                    KernelArg::NullMem => (self.api.set_kernel_arg)(self.kernel, i, 8, ptr::null()),
                    KernelArg::Value(v) => (self.api.set_kernel_arg)(self.kernel, i, v.len(), v.as_ptr().cast()),
                    KernelArg::Local(n) => (self.api.set_kernel_arg)(self.kernel, i, *n, ptr::null()),
                }
            };
            check(e, &what)?;
        }
        Ok(())
    }
}

impl Drop for ClKernel {
    fn drop(&mut self) {
        // SAFETY: released once.
        unsafe { (self.api.release_kernel)(self.kernel) };
    }
}
