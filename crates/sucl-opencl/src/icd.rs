//! The C entry points: what the ICD loader finds through `clIcdGetPlatformIDsKHR`,
//! `clGetExtensionFunctionAddress` and the dispatch table. Each one checks its handles
//! against the registry, checks its arguments, and turns the work into sucl-remote commands.
//! Every entry point runs under [`error::guard`]: no panic crosses into C.

use crate::cl::{self, Handle, Int, Uint};
use crate::dispatch::{Dispatch, NAMES};
use crate::error::{self, answer, bytes, cstr, status};
use crate::model::*;
use crate::object::{Data, Ref};
use crate::platform::{self, Device, PlatformData};
use std::ffi::{c_char, c_void, CStr};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use sucl_remote::wire::{self, cl_query, ClArg, Command};

type R<T> = Result<T, Int>;

/// The dispatch table every object points to.
pub(crate) fn dispatch() -> *const Dispatch {
    static TABLE: OnceLock<Dispatch> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [ptr::null::<c_void>(); 149];
        for (i, n) in NAMES.iter().enumerate() {
            t[i] = lookup(n).unwrap_or(ptr::null());
        }
        Dispatch(t)
    })
}

fn obj<T: Data>(h: Handle, err: Int) -> R<Ref<T>> {
    Ref::from_handle(h).ok_or(err)
}

/// A C array of `n` handles (non-null when `n` > 0).
fn list<'a>(n: Uint, p: *const Handle) -> R<&'a [Handle]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(cl::INVALID_VALUE);
    }
    // SAFETY: the application passes `n` handles at `p`.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

fn wait_list(ctx: &Ref<Context>, n: Uint, p: *const Handle) -> R<Vec<Ref<Event>>> {
    if (n == 0) != p.is_null() {
        return Err(cl::INVALID_EVENT_WAIT_LIST);
    }
    let hs = list(n, p).map_err(|_| cl::INVALID_EVENT_WAIT_LIST)?;
    let mut out = Vec::with_capacity(hs.len());
    for h in hs {
        let e: Ref<Event> = obj(*h, cl::INVALID_EVENT_WAIT_LIST)?;
        if !e.ctx.same(ctx) {
            return Err(cl::INVALID_CONTEXT);
        }
        out.push(e);
    }
    Ok(out)
}

fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: a pointer the application passed for this result (null checked).
        unsafe { *out = v };
    }
}

/// Submits a command on `q` after `waits`, with an event for `event_out` if it asks for one,
/// and waits for it if `blocking`.
fn enqueue(
    q: &Ref<Queue>,
    nwait: Uint,
    wait: *const Handle,
    event_out: *mut Handle,
    command: Uint,
    blocking: bool,
    run: impl FnOnce() -> R<()> + Send + 'static,
) -> R<()> {
    let waits = wait_list(&q.ctx, nwait, wait)?;
    let timed = command == cl::COMMAND_NDRANGE_KERNEL && q.profiling();
    let ev = (!event_out.is_null() || blocking).then(|| Event::new(q.ctx.clone(), Some(q.clone()), command, cl::QUEUED, timed));
    let result: Arc<Mutex<Option<Int>>> = Arc::new(Mutex::new(None));
    let slot = result.clone();
    Queue::submit(q, waits, ev.clone(), move || {
        let r = run();
        *lock(&slot) = Some(r.err().unwrap_or(cl::SUCCESS));
        r
    })?;
    if blocking {
        let e = ev.as_ref().expect("made for blocking");
        let st = resolve(e);
        if let Some(code) = *lock(&result) {
            if code != cl::SUCCESS {
                return Err(code);
            }
        }
        if st < 0 {
            return Err(cl::EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
        }
    }
    if let Some(e) = ev {
        if event_out.is_null() {
            drop(e);
        } else {
            put(event_out, e.into_handle());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Platform and devices

const PLATFORM_EXTENSIONS: &str = "cl_khr_icd";

unsafe extern "C" fn cl_icd_get_platform_ids_khr(n: Uint, platforms: *mut Handle, num: *mut Uint) -> Int {
    status(|| {
        if (n == 0 && !platforms.is_null()) || (platforms.is_null() && num.is_null()) {
            return Err(cl::INVALID_VALUE);
        }
        let p = platform::get();
        put(num, p.is_some() as Uint);
        match p {
            None => Err(cl::PLATFORM_NOT_FOUND_KHR),
            Some(p) => {
                if !platforms.is_null() {
                    put(platforms, p.handle.handle());
                }
                Ok(())
            }
        }
    })
}

fn the_platform(h: Handle) -> R<&'static platform::Platform> {
    let p = platform::get().ok_or(cl::INVALID_PLATFORM)?;
    if !h.is_null() && h != p.handle.handle() {
        return Err(cl::INVALID_PLATFORM);
    }
    Ok(p)
}

unsafe extern "C" fn cl_get_platform_info(platform: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        the_platform(platform)?;
        let v = match param {
            cl::PLATFORM_PROFILE => cstr("FULL_PROFILE"),
            cl::PLATFORM_VERSION => cstr("OpenCL 1.2 sucl"),
            cl::PLATFORM_NAME => cstr("sucl"),
            cl::PLATFORM_VENDOR => cstr("sucl"),
            cl::PLATFORM_EXTENSIONS => cstr(PLATFORM_EXTENSIONS),
            cl::PLATFORM_ICD_SUFFIX_KHR => cstr("sucl"),
            cl::PLATFORM_HOST_TIMER_RESOLUTION => bytes(0u64),
            cl::PLATFORM_NUMERIC_VERSION => bytes((1u32 << 22) | (2 << 12)),
            cl::PLATFORM_EXTENSIONS_WITH_VERSION => {
                let mut v = vec![0u8; 4 + 64];
                v[..4].copy_from_slice(&(1u32 << 22).to_ne_bytes());
                v[4..4 + PLATFORM_EXTENSIONS.len()].copy_from_slice(PLATFORM_EXTENSIONS.as_bytes());
                v.rotate_left(4); // name[64] first, then the version
                v
            }
            _ => return Err(cl::INVALID_VALUE),
        };
        answer(&v, size, value, ret)
    })
}

fn type_matches(p: &platform::Platform, d: &Device, want: u64) -> bool {
    if want == cl::DEVICE_TYPE_ALL {
        return true;
    }
    let t = d.info_num(p, cl::DEVICE_TYPE).unwrap_or(0);
    t & want != 0 || (want & cl::DEVICE_TYPE_DEFAULT != 0 && p.devices.first().is_some_and(|f| ptr::eq(&**f, d)))
}

unsafe extern "C" fn cl_get_device_ids(platform: Handle, kind: u64, n: Uint, devices: *mut Handle, num: *mut Uint) -> Int {
    status(|| {
        let p = the_platform(platform)?;
        let known =
            cl::DEVICE_TYPE_DEFAULT | cl::DEVICE_TYPE_CPU | cl::DEVICE_TYPE_GPU | cl::DEVICE_TYPE_ACCELERATOR | cl::DEVICE_TYPE_CUSTOM;
        if kind != cl::DEVICE_TYPE_ALL && (kind & !known != 0 || kind == 0) {
            return Err(cl::INVALID_DEVICE_TYPE);
        }
        if (n == 0 && !devices.is_null()) || (devices.is_null() && num.is_null()) {
            return Err(cl::INVALID_VALUE);
        }
        let found: Vec<&Ref<Device>> = p.devices.iter().filter(|d| type_matches(p, d, kind)).collect();
        put(num, found.len() as Uint);
        if found.is_empty() {
            return Err(cl::DEVICE_NOT_FOUND);
        }
        for (i, d) in found.iter().take(n as usize).enumerate() {
            // SAFETY: the application gave room for `n` handles.
            unsafe { *devices.add(i) = d.handle() };
        }
        Ok(())
    })
}

/// Extensions a remote device keeps: those that are the compiler's alone (the rest need
/// host-side support this library does not give).
fn kept_extensions(all: &str) -> String {
    const KEEP: [&str; 12] = [
        "cl_khr_byte_addressable_store",
        "cl_khr_global_int32_base_atomics",
        "cl_khr_global_int32_extended_atomics",
        "cl_khr_local_int32_base_atomics",
        "cl_khr_local_int32_extended_atomics",
        "cl_khr_int64_base_atomics",
        "cl_khr_int64_extended_atomics",
        "cl_khr_fp64",
        "cl_khr_fp16",
        "cl_khr_3d_image_writes_never",
        "cl_khr_subgroups_never",
        "cl_khr_local_int32_never",
    ];
    all.split_whitespace().filter(|e| KEEP.contains(e)).collect::<Vec<_>>().join(" ")
}

fn device_info(p: &platform::Platform, d: &Ref<Device>, param: Uint) -> R<Vec<u8>> {
    let zero_size = || bytes(0usize);
    Ok(match param {
        cl::DEVICE_PLATFORM => bytes(p.handle.handle()),
        cl::DEVICE_PARENT_DEVICE => bytes(ptr::null_mut::<c_void>()),
        cl::DEVICE_REFERENCE_COUNT => bytes(1u32),
        cl::DEVICE_VERSION => cstr("OpenCL 1.2 sucl"),
        cl::DEVICE_NUMERIC_VERSION => bytes((1u32 << 22) | (2 << 12)),
        cl::DEVICE_EXTENSIONS => cstr(&kept_extensions(&text(&d.info(p, param)?))),
        cl::DEVICE_EXTENSIONS_WITH_VERSION
        | cl::DEVICE_ILS_WITH_VERSION
        | cl::DEVICE_BUILT_IN_KERNELS_WITH_VERSION
        | cl::DEVICE_PARTITION_PROPERTIES
        | cl::DEVICE_PARTITION_TYPE => Vec::new(),
        cl::DEVICE_BUILT_IN_KERNELS | cl::DEVICE_IL_VERSION | cl::DEVICE_LATEST_CONFORMANCE_VERSION_PASSED => cstr(""),
        cl::DEVICE_IMAGE_SUPPORT | cl::DEVICE_HOST_UNIFIED_MEMORY | cl::DEVICE_PIPE_SUPPORT => bytes(0u32),
        cl::DEVICE_GENERIC_ADDRESS_SPACE_SUPPORT
        | cl::DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT
        | cl::DEVICE_WORK_GROUP_COLLECTIVE_FUNCTIONS_SUPPORT => bytes(0u32),
        cl::DEVICE_MAX_READ_IMAGE_ARGS
        | cl::DEVICE_MAX_WRITE_IMAGE_ARGS
        | cl::DEVICE_MAX_READ_WRITE_IMAGE_ARGS
        | cl::DEVICE_MAX_SAMPLERS
        | cl::DEVICE_IMAGE_PITCH_ALIGNMENT
        | cl::DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT
        | cl::DEVICE_MAX_PIPE_ARGS
        | cl::DEVICE_PIPE_MAX_ACTIVE_RESERVATIONS
        | cl::DEVICE_PIPE_MAX_PACKET_SIZE
        | cl::DEVICE_MAX_ON_DEVICE_QUEUES
        | cl::DEVICE_MAX_ON_DEVICE_EVENTS
        | cl::DEVICE_MAX_NUM_SUB_GROUPS
        | cl::DEVICE_PARTITION_MAX_SUB_DEVICES => bytes(0u32),
        cl::DEVICE_IMAGE2D_MAX_WIDTH
        | cl::DEVICE_IMAGE2D_MAX_HEIGHT
        | cl::DEVICE_IMAGE3D_MAX_WIDTH
        | cl::DEVICE_IMAGE3D_MAX_HEIGHT
        | cl::DEVICE_IMAGE3D_MAX_DEPTH
        | cl::DEVICE_IMAGE_MAX_BUFFER_SIZE
        | cl::DEVICE_IMAGE_MAX_ARRAY_SIZE => zero_size(),
        cl::DEVICE_SVM_CAPABILITIES | cl::DEVICE_PARTITION_AFFINITY_DOMAIN | cl::DEVICE_QUEUE_ON_DEVICE_PROPERTIES => bytes(0u64),
        cl::DEVICE_DEVICE_ENQUEUE_CAPABILITIES | cl::DEVICE_ATOMIC_MEMORY_CAPABILITIES | cl::DEVICE_ATOMIC_FENCE_CAPABILITIES => {
            bytes(0u64)
        }
        cl::DEVICE_QUEUE_PROPERTIES => bytes(cl::QUEUE_PROFILING_ENABLE | cl::QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE),
        // Native kernels (host functions) are not offered: kernels only.
        cl::DEVICE_EXECUTION_CAPABILITIES => bytes(cl::EXEC_KERNEL),
        cl::DEVICE_OPENCL_C_ALL_VERSIONS | cl::DEVICE_OPENCL_C_FEATURES => Vec::new(),
        _ => d.info(p, param)?,
    })
}

unsafe extern "C" fn cl_get_device_info(device: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let d: Ref<Device> = obj(device, cl::INVALID_DEVICE)?;
        let p = platform::get().ok_or(cl::INVALID_DEVICE)?;
        let v = device_info(p, &d, param)?;
        answer(&v, size, value, ret)
    })
}

unsafe extern "C" fn cl_retain_device(device: Handle) -> Int {
    status(|| obj::<Device>(device, cl::INVALID_DEVICE).map(|_| ()))
}

unsafe extern "C" fn cl_create_sub_devices(device: Handle, _p: *const isize, _n: Uint, _out: *mut Handle, _num: *mut Uint) -> Int {
    status(|| {
        obj::<Device>(device, cl::INVALID_DEVICE)?;
        Err(cl::INVALID_VALUE) // CL_DEVICE_PARTITION_PROPERTIES is empty
    })
}

// ---------------------------------------------------------------------------------------------
// Contexts

fn context_props(props: *const isize) -> R<Vec<isize>> {
    let mut out = Vec::new();
    if props.is_null() {
        return Ok(out);
    }
    let mut i = 0;
    loop {
        // SAFETY: a zero-terminated list of (name, value) pairs, as the specification says.
        let name = unsafe { *props.add(i) };
        if name == 0 {
            out.push(0);
            return Ok(out);
        }
        // SAFETY: as above; a name is followed by its value.
        let value = unsafe { *props.add(i + 1) };
        match name {
            cl::CONTEXT_PLATFORM => {
                the_platform(value as Handle)?;
            }
            cl::CONTEXT_INTEROP_USER_SYNC if value == 0 || value == 1 => {}
            _ => return Err(cl::INVALID_PROPERTY),
        }
        if out.chunks(2).any(|c| c[0] == name) {
            return Err(cl::INVALID_PROPERTY);
        }
        out.push(name);
        out.push(value);
        i += 2;
    }
}

fn make_context(props: *const isize, devices: Vec<Ref<Device>>) -> R<Handle> {
    let props = context_props(props)?;
    let p = platform::get().ok_or(cl::INVALID_PLATFORM)?;
    let mut servers: Vec<usize> = devices.iter().map(|d| d.server).collect();
    servers.sort_unstable();
    servers.dedup();
    if servers.len() > 1 {
        p.ensure_mesh()?;
    }
    Ok(Ref::new(Context { devices, props }).into_handle())
}

unsafe extern "C" fn cl_create_context(
    props: *const isize,
    n: Uint,
    devices: *const Handle,
    notify: Option<cl::ContextCallback>,
    user: *mut c_void,
    errcode: *mut Int,
) -> Handle {
    error::create(errcode, || {
        if n == 0 || devices.is_null() || (notify.is_none() && !user.is_null()) {
            return Err(cl::INVALID_VALUE);
        }
        let mut ds: Vec<Ref<Device>> = Vec::new();
        for h in list(n, devices)? {
            let d = obj(*h, cl::INVALID_DEVICE)?;
            if !ds.iter().any(|x| x.same(&d)) {
                ds.push(d);
            }
        }
        make_context(props, ds)
    })
}

unsafe extern "C" fn cl_create_context_from_type(
    props: *const isize,
    kind: u64,
    notify: Option<cl::ContextCallback>,
    user: *mut c_void,
    errcode: *mut Int,
) -> Handle {
    error::create(errcode, || {
        if notify.is_none() && !user.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let p = platform::get().ok_or(cl::INVALID_PLATFORM)?;
        let ds: Vec<Ref<Device>> = p.devices.iter().filter(|d| type_matches(p, d, kind)).cloned().collect();
        if ds.is_empty() {
            return Err(cl::DEVICE_NOT_FOUND);
        }
        make_context(props, ds)
    })
}

macro_rules! retain_release {
    ($retain:ident, $release:ident, $t:ty, $err:expr) => {
        unsafe extern "C" fn $retain(h: Handle) -> Int {
            status(|| obj::<$t>(h, $err).map(|o| o.retain_app()))
        }
        unsafe extern "C" fn $release(h: Handle) -> Int {
            status(|| obj::<$t>(h, $err).map(|o| o.release_app()))
        }
    };
}

retain_release!(cl_retain_context, cl_release_context, Context, cl::INVALID_CONTEXT);
retain_release!(cl_retain_command_queue, cl_release_command_queue_inner, Queue, cl::INVALID_COMMAND_QUEUE);
retain_release!(cl_retain_mem_object, cl_release_mem_object, Mem, cl::INVALID_MEM_OBJECT);
retain_release!(cl_retain_program, cl_release_program, Program, cl::INVALID_PROGRAM);
retain_release!(cl_retain_kernel, cl_release_kernel, Kernel, cl::INVALID_KERNEL);
retain_release!(cl_retain_event, cl_release_event, Event, cl::INVALID_EVENT);

unsafe extern "C" fn cl_release_command_queue(h: Handle) -> Int {
    // Releasing a queue flushes it (the commands are posted already).
    // SAFETY: forwards the application's handle.
    unsafe { cl_release_command_queue_inner(h) }
}

unsafe extern "C" fn cl_get_context_info(ctx: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let c: Ref<Context> = obj(ctx, cl::INVALID_CONTEXT)?;
        let v = match param {
            cl::CONTEXT_REFERENCE_COUNT => bytes(c.count()),
            cl::CONTEXT_DEVICES => handles(&c.devices),
            cl::CONTEXT_NUM_DEVICES => bytes(c.devices.len() as Uint),
            cl::CONTEXT_PROPERTIES => c.props.iter().flat_map(|v| v.to_ne_bytes()).collect(),
            _ => return Err(cl::INVALID_VALUE),
        };
        answer(&v, size, value, ret)
    })
}

// ---------------------------------------------------------------------------------------------
// Queues

fn make_queue(ctx: Handle, device: Handle, props: u64) -> R<Handle> {
    let c: Ref<Context> = obj(ctx, cl::INVALID_CONTEXT)?;
    let d: Ref<Device> = obj(device, cl::INVALID_DEVICE)?;
    if !c.has(&d) {
        return Err(cl::INVALID_DEVICE);
    }
    if props & !(cl::QUEUE_PROFILING_ENABLE | cl::QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0 {
        return Err(cl::INVALID_VALUE);
    }
    Ok(Queue::create(c, d, props)?.into_handle())
}

unsafe extern "C" fn cl_create_command_queue(ctx: Handle, device: Handle, props: u64, errcode: *mut Int) -> Handle {
    error::create(errcode, || make_queue(ctx, device, props))
}

unsafe extern "C" fn cl_create_command_queue_with_properties(ctx: Handle, device: Handle, props: *const u64, errcode: *mut Int) -> Handle {
    error::create(errcode, || {
        let mut flags = 0;
        let mut i = 0;
        while !props.is_null() {
            // SAFETY: a zero-terminated list of (name, value) pairs.
            let (name, value) = unsafe { (*props.add(i), if *props.add(i) == 0 { 0 } else { *props.add(i + 1) }) };
            match name {
                0 => break,
                x if x == cl::QUEUE_PROPERTIES as u64 => flags = value,
                _ => return Err(cl::INVALID_VALUE),
            }
            i += 2;
        }
        make_queue(ctx, device, flags)
    })
}

unsafe extern "C" fn cl_get_command_queue_info(q: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let q: Ref<Queue> = obj(q, cl::INVALID_COMMAND_QUEUE)?;
        let v = match param {
            cl::QUEUE_CONTEXT => bytes(q.ctx.handle()),
            cl::QUEUE_DEVICE => bytes(q.device.handle()),
            cl::QUEUE_REFERENCE_COUNT => bytes(q.count()),
            cl::QUEUE_PROPERTIES => bytes(q.props),
            cl::QUEUE_PROPERTIES_ARRAY => Vec::new(),
            _ => return Err(cl::INVALID_VALUE),
        };
        answer(&v, size, value, ret)
    })
}

unsafe extern "C" fn cl_flush(q: Handle) -> Int {
    status(|| obj::<Queue>(q, cl::INVALID_COMMAND_QUEUE).map(|_| ()))
}

unsafe extern "C" fn cl_finish(q: Handle) -> Int {
    status(|| obj::<Queue>(q, cl::INVALID_COMMAND_QUEUE)?.finish())
}

// ---------------------------------------------------------------------------------------------
// Memory

fn check_mem_flags(flags: u64) -> R<()> {
    let access = flags & (cl::MEM_READ_WRITE | cl::MEM_WRITE_ONLY | cl::MEM_READ_ONLY);
    let host = flags & (cl::MEM_HOST_WRITE_ONLY | cl::MEM_HOST_READ_ONLY | cl::MEM_HOST_NO_ACCESS);
    let known = cl::MEM_READ_WRITE
        | cl::MEM_WRITE_ONLY
        | cl::MEM_READ_ONLY
        | cl::MEM_USE_HOST_PTR
        | cl::MEM_ALLOC_HOST_PTR
        | cl::MEM_COPY_HOST_PTR
        | cl::MEM_HOST_WRITE_ONLY
        | cl::MEM_HOST_READ_ONLY
        | cl::MEM_HOST_NO_ACCESS;
    if flags & !known != 0
        || access.count_ones() > 1
        || host.count_ones() > 1
        || (flags & cl::MEM_USE_HOST_PTR != 0 && flags & (cl::MEM_ALLOC_HOST_PTR | cl::MEM_COPY_HOST_PTR) != 0)
    {
        return Err(cl::INVALID_VALUE);
    }
    Ok(())
}

unsafe extern "C" fn cl_create_buffer(ctx: Handle, flags: u64, size: usize, host: *mut c_void, errcode: *mut Int) -> Handle {
    error::create(errcode, || {
        let c: Ref<Context> = obj(ctx, cl::INVALID_CONTEXT)?;
        let flags = if flags == 0 { cl::MEM_READ_WRITE } else { flags };
        check_mem_flags(flags)?;
        let p = platform::get().ok_or(cl::INVALID_CONTEXT)?;
        let max = c.devices.iter().map(|d| d.info_num(p, cl::DEVICE_MAX_MEM_ALLOC_SIZE).unwrap_or(u64::MAX)).min().unwrap_or(0);
        if size == 0 || size as u64 > max {
            return Err(cl::INVALID_BUFFER_SIZE);
        }
        let wants_host = flags & (cl::MEM_USE_HOST_PTR | cl::MEM_COPY_HOST_PTR) != 0;
        if wants_host == host.is_null() {
            return Err(cl::INVALID_HOST_PTR);
        }
        let init = wants_host.then(|| {
            // SAFETY: the application passes `size` readable bytes at `host`.
            unsafe { std::slice::from_raw_parts(host.cast::<u8>(), size) }.to_vec()
        });
        let host_ptr = if flags & cl::MEM_USE_HOST_PTR != 0 { host as usize } else { 0 };
        Ok(Ref::new(Mem {
            ctx: c,
            flags,
            size,
            host_ptr,
            parent: None,
            store: Arc::new(Store::new(size, init)),
            base: 0,
            maps: Mutex::new(Default::default()),
            destructors: Mutex::new(Vec::new()),
            handle: Default::default(),
        })
        .into_mem_handle())
    })
}

unsafe extern "C" fn cl_create_sub_buffer(buf: Handle, flags: u64, kind: Uint, info: *const c_void, errcode: *mut Int) -> Handle {
    error::create(errcode, || {
        let m: Ref<Mem> = obj(buf, cl::INVALID_MEM_OBJECT)?;
        if m.parent.is_some() {
            return Err(cl::INVALID_MEM_OBJECT);
        }
        if kind != cl::BUFFER_CREATE_TYPE_REGION || info.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        if flags & (cl::MEM_USE_HOST_PTR | cl::MEM_ALLOC_HOST_PTR | cl::MEM_COPY_HOST_PTR) != 0 {
            return Err(cl::INVALID_VALUE);
        }
        check_mem_flags(flags)?;
        let access = cl::MEM_READ_WRITE | cl::MEM_WRITE_ONLY | cl::MEM_READ_ONLY;
        let host = cl::MEM_HOST_WRITE_ONLY | cl::MEM_HOST_READ_ONLY | cl::MEM_HOST_NO_ACCESS;
        let parent_access = m.flags & access;
        if (m.flags & cl::MEM_WRITE_ONLY != 0 && flags & (cl::MEM_READ_WRITE | cl::MEM_READ_ONLY) != 0)
            || (m.flags & cl::MEM_READ_ONLY != 0 && flags & (cl::MEM_READ_WRITE | cl::MEM_WRITE_ONLY) != 0)
            || (m.flags & cl::MEM_HOST_WRITE_ONLY != 0 && flags & cl::MEM_HOST_READ_ONLY != 0)
            || (m.flags & cl::MEM_HOST_READ_ONLY != 0 && flags & cl::MEM_HOST_WRITE_ONLY != 0)
            || (m.flags & cl::MEM_HOST_NO_ACCESS != 0 && flags & (cl::MEM_HOST_READ_ONLY | cl::MEM_HOST_WRITE_ONLY) != 0)
        {
            return Err(cl::INVALID_VALUE);
        }
        // SAFETY: a cl_buffer_region, as the creation type says.
        let region = unsafe { *info.cast::<cl::BufferRegion>() };
        if region.size == 0 {
            return Err(cl::INVALID_BUFFER_SIZE);
        }
        m.check(region.origin, region.size)?;
        let p = platform::get().ok_or(cl::INVALID_CONTEXT)?;
        let aligned = m.ctx.devices.iter().any(|d| {
            let bits = d.info_num(p, cl::DEVICE_MEM_BASE_ADDR_ALIGN).unwrap_or(8).max(8);
            (region.origin as u64).is_multiple_of(bits / 8)
        });
        if !aligned {
            return Err(cl::MISALIGNED_SUB_BUFFER_OFFSET);
        }
        let mut f = if flags & access == 0 { parent_access | (flags & !access) } else { flags };
        if f & host == 0 {
            f |= m.flags & host;
        }
        f |= m.flags & (cl::MEM_USE_HOST_PTR | cl::MEM_ALLOC_HOST_PTR | cl::MEM_COPY_HOST_PTR);
        let host_ptr = if m.host_ptr != 0 { m.host_ptr + region.origin } else { 0 };
        Ok(Ref::new(Mem {
            ctx: m.ctx.clone(),
            flags: f,
            size: region.size,
            host_ptr,
            parent: Some((m.clone(), region.origin)),
            store: m.store.clone(),
            base: m.base + region.origin,
            maps: Mutex::new(Default::default()),
            destructors: Mutex::new(Vec::new()),
            handle: Default::default(),
        })
        .into_mem_handle())
    })
}

unsafe extern "C" fn cl_get_mem_object_info(mem: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let m: Ref<Mem> = obj(mem, cl::INVALID_MEM_OBJECT)?;
        let v = match param {
            cl::MEM_TYPE => bytes(cl::MEM_OBJECT_BUFFER),
            cl::MEM_FLAGS => bytes(m.flags),
            cl::MEM_SIZE => bytes(m.size),
            cl::MEM_HOST_PTR => bytes(m.host_ptr),
            cl::MEM_MAP_COUNT => bytes(lock(&m.maps).len() as Uint),
            cl::MEM_REFERENCE_COUNT => bytes(m.count()),
            cl::MEM_CONTEXT => bytes(m.ctx.handle()),
            cl::MEM_ASSOCIATED_MEMOBJECT => bytes(m.parent.as_ref().map_or(ptr::null_mut(), |(p, _)| p.handle())),
            cl::MEM_OFFSET => bytes(m.parent.as_ref().map_or(0usize, |(_, o)| *o)),
            cl::MEM_USES_SVM_POINTER => bytes(0u32),
            cl::MEM_PROPERTIES => Vec::new(),
            _ => return Err(cl::INVALID_VALUE),
        };
        answer(&v, size, value, ret)
    })
}

unsafe extern "C" fn cl_set_mem_object_destructor_callback(mem: Handle, f: Option<cl::MemCallback>, user: *mut c_void) -> Int {
    status(|| {
        let m: Ref<Mem> = obj(mem, cl::INVALID_MEM_OBJECT)?;
        let f = f.ok_or(cl::INVALID_VALUE)?;
        lock(&m.destructors).push((f, user as usize));
        Ok(())
    })
}

unsafe extern "C" fn cl_get_supported_image_formats(ctx: Handle, _f: u64, _t: Uint, _n: Uint, _out: *mut c_void, num: *mut Uint) -> Int {
    status(|| {
        obj::<Context>(ctx, cl::INVALID_CONTEXT)?;
        put(num, 0);
        Ok(())
    })
}

/// Checks a queue and a buffer belong together and the host may do `host_op` on it.
fn queue_mem(q: Handle, mem: Handle) -> R<(Ref<Queue>, Ref<Mem>)> {
    let q: Ref<Queue> = obj(q, cl::INVALID_COMMAND_QUEUE)?;
    let m: Ref<Mem> = obj(mem, cl::INVALID_MEM_OBJECT)?;
    if !q.ctx.same(&m.ctx) {
        return Err(cl::INVALID_CONTEXT);
    }
    Ok((q, m))
}

unsafe extern "C" fn cl_enqueue_read_buffer(
    q: Handle,
    mem: Handle,
    blocking: Uint,
    offset: usize,
    size: usize,
    host: *mut c_void,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, m) = queue_mem(q, mem)?;
        if host.is_null() || size == 0 {
            return Err(cl::INVALID_VALUE);
        }
        m.check(offset, size)?;
        if m.flags & (cl::MEM_HOST_WRITE_ONLY | cl::MEM_HOST_NO_ACCESS) != 0 {
            return Err(cl::INVALID_OPERATION);
        }
        let (dst, dev, store, at) = (HostPtr::of(host), q.device.clone(), m.store.clone(), m.base + offset);
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_READ_BUFFER, blocking != 0, move || {
            let id = store.place(&dev, false)?;
            // SAFETY: the application keeps `size` writable bytes at `host` until the read
            // completes, and touches them only after it (the bytes go straight there).
            let out = unsafe { std::slice::from_raw_parts_mut(dst.get(), size) };
            read_into(r, id, at, out)
        })
    })
}

unsafe extern "C" fn cl_enqueue_write_buffer(
    q: Handle,
    mem: Handle,
    blocking: Uint,
    offset: usize,
    size: usize,
    host: *const c_void,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, m) = queue_mem(q, mem)?;
        if host.is_null() || size == 0 {
            return Err(cl::INVALID_VALUE);
        }
        m.check(offset, size)?;
        if m.flags & (cl::MEM_HOST_READ_ONLY | cl::MEM_HOST_NO_ACCESS) != 0 {
            return Err(cl::INVALID_OPERATION);
        }
        let r = q.remote();
        let (dev, store, at) = (q.device.clone(), m.store.clone(), m.base + offset);
        let whole = offset == 0 && size == store.size;
        if blocking != 0 {
            // The call waits for the command, so the command reads the application's bytes
            // piece by piece as it sends them, rather than copying all of them first.
            // SAFETY: the application passes `size` readable bytes at `host`, left alone until
            // this call returns; `release` below runs before it returns.
            let bytes = Arc::new(unsafe { BorrowedHost::new(host.cast::<u8>(), size) });
            let reader = bytes.clone();
            let r2 = enqueue(&q, nwait, wait, event, cl::COMMAND_WRITE_BUFFER, true, move || {
                let id = store.place(&dev, whole)?;
                reader.with(|data| write_chunks(r, id, at, data)).unwrap_or(Err(cl::OUT_OF_RESOURCES))?;
                store.written(&dev);
                Ok(())
            });
            bytes.release();
            return r2;
        }
        // The bytes are taken now: the host memory may be reused as soon as this returns.
        // SAFETY: the application passes `size` readable bytes at `host`.
        let data = pieces(r, unsafe { std::slice::from_raw_parts(host.cast::<u8>(), size) });
        enqueue(&q, nwait, wait, event, cl::COMMAND_WRITE_BUFFER, false, move || {
            let id = store.place(&dev, whole)?;
            write_pieces(r, id, at, data)?;
            store.written(&dev);
            Ok(())
        })
    })
}

unsafe extern "C" fn cl_enqueue_copy_buffer(
    q: Handle,
    src: Handle,
    dst: Handle,
    src_offset: usize,
    dst_offset: usize,
    size: usize,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, s) = queue_mem(q, src)?;
        let (_, d) = queue_mem(q.handle(), dst)?;
        if size == 0 {
            return Err(cl::INVALID_VALUE);
        }
        s.check(src_offset, size)?;
        d.check(dst_offset, size)?;
        let (a, b) = (s.base + src_offset, d.base + dst_offset);
        if Arc::ptr_eq(&s.store, &d.store) && a < b + size && b < a + size {
            return Err(cl::MEM_COPY_OVERLAP);
        }
        let dev = q.device.clone();
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_COPY_BUFFER, false, move || {
            let si = s.store.place(&dev, false)?;
            let di = d.store.place(&dev, false)?;
            r.post_raw(Command::Copy { src: si, src_offset: a as u64, dst: di, dst_offset: b as u64, len: size as u64 })
                .map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
            d.store.written(&dev);
            Ok(())
        })
    })
}

unsafe extern "C" fn cl_enqueue_fill_buffer(
    q: Handle,
    mem: Handle,
    pattern: *const c_void,
    pattern_size: usize,
    offset: usize,
    size: usize,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, m) = queue_mem(q, mem)?;
        if pattern.is_null()
            || !pattern_size.is_power_of_two()
            || pattern_size > 128
            || !offset.is_multiple_of(pattern_size)
            || !size.is_multiple_of(pattern_size)
        {
            return Err(cl::INVALID_VALUE);
        }
        m.check(offset, size)?;
        // SAFETY: the application passes `pattern_size` readable bytes.
        let pat = unsafe { std::slice::from_raw_parts(pattern.cast::<u8>(), pattern_size) }.to_vec();
        let (dev, store, at) = (q.device.clone(), m.store.clone(), m.base + offset);
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_FILL_BUFFER, false, move || {
            let id = store.place(&dev, at == 0 && size == store.size)?;
            if pat.len() <= wire::MAX_PATTERN {
                r.post_raw(Command::Fill { buffer: id, offset: at as u64, len: size as u64, pattern: pat })
                    .map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
            } else {
                let data: Vec<u8> = pat.iter().copied().cycle().take(size).collect();
                write_chunks(r, id, at, &data)?;
            }
            store.written(&dev);
            Ok(())
        })
    })
}

/// The rows of a rectangle: (offset in the buffer, offset in the host memory) of each row of
/// `region[0]` bytes.
struct Rect {
    rows: Vec<(usize, usize)>,
    width: usize,
}

/// Reads three `size_t`s.
fn three(p: *const usize) -> R<[usize; 3]> {
    if p.is_null() {
        return Err(cl::INVALID_VALUE);
    }
    // SAFETY: the application passes three size_t values.
    Ok(unsafe { [*p, *p.add(1), *p.add(2)] })
}

#[allow(clippy::too_many_arguments)]
fn rect(
    size_a: usize,
    size_b: usize,
    oa: [usize; 3],
    ob: [usize; 3],
    region: [usize; 3],
    mut arp: usize,
    mut asp: usize,
    mut brp: usize,
    mut bsp: usize,
) -> R<Rect> {
    if region.contains(&0) {
        return Err(cl::INVALID_VALUE);
    }
    if arp == 0 {
        arp = region[0];
    }
    if asp == 0 {
        asp = region[1] * arp;
    }
    if brp == 0 {
        brp = region[0];
    }
    if bsp == 0 {
        bsp = region[1] * brp;
    }
    if arp < region[0]
        || brp < region[0]
        || asp < region[1] * arp
        || bsp < region[1] * brp
        || !asp.is_multiple_of(arp)
        || !bsp.is_multiple_of(brp)
    {
        return Err(cl::INVALID_VALUE);
    }
    let at = |o: [usize; 3], rp: usize, sp: usize, y: usize, z: usize| (o[2] + z) * sp + (o[1] + y) * rp + o[0];
    let end_a = at(oa, arp, asp, region[1] - 1, region[2] - 1) + region[0];
    let end_b = at(ob, brp, bsp, region[1] - 1, region[2] - 1) + region[0];
    if end_a > size_a || end_b > size_b {
        return Err(cl::INVALID_VALUE);
    }
    let mut rows = Vec::with_capacity(region[1] * region[2]);
    for z in 0..region[2] {
        for y in 0..region[1] {
            rows.push((at(oa, arp, asp, y, z), at(ob, brp, bsp, y, z)));
        }
    }
    Ok(Rect { rows, width: region[0] })
}

unsafe extern "C" fn cl_enqueue_read_buffer_rect(
    q: Handle,
    mem: Handle,
    blocking: Uint,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    brp: usize,
    bsp: usize,
    hrp: usize,
    hsp: usize,
    host: *mut c_void,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, m) = queue_mem(q, mem)?;
        if host.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let rc = rect(m.size, usize::MAX, three(buffer_origin)?, three(host_origin)?, three(region)?, brp, bsp, hrp, hsp)?;
        let (dst, dev, store, base) = (HostPtr::of(host), q.device.clone(), m.store.clone(), m.base);
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_READ_BUFFER_RECT, blocking != 0, move || {
            let id = store.place(&dev, false)?;
            let lo = rc.rows.iter().map(|r| r.0).min().unwrap_or(0);
            let hi = rc.rows.iter().map(|r| r.0).max().unwrap_or(0) + rc.width;
            let span = read_chunks(r, id, base + lo, hi - lo)?;
            for (b, h) in &rc.rows {
                // SAFETY: the rectangle lies in the application's host memory, which it keeps
                // until the read completes.
                unsafe { ptr::copy_nonoverlapping(span.as_ptr().add(b - lo), dst.get().add(*h), rc.width) };
            }
            Ok(())
        })
    })
}

unsafe extern "C" fn cl_enqueue_write_buffer_rect(
    q: Handle,
    mem: Handle,
    blocking: Uint,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    brp: usize,
    bsp: usize,
    hrp: usize,
    hsp: usize,
    host: *const c_void,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, m) = queue_mem(q, mem)?;
        if host.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let rc = rect(m.size, usize::MAX, three(buffer_origin)?, three(host_origin)?, three(region)?, brp, bsp, hrp, hsp)?;
        // The rows are taken now (the host memory may be reused once this returns).
        let rows: Vec<(usize, Vec<u8>)> = rc
            .rows
            .iter()
            .map(|(b, h)| {
                // SAFETY: the rectangle lies in the application's host memory.
                (*b, unsafe { std::slice::from_raw_parts(host.cast::<u8>().add(*h), rc.width) }.to_vec())
            })
            .collect();
        let (dev, store, base) = (q.device.clone(), m.store.clone(), m.base);
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_WRITE_BUFFER_RECT, blocking != 0, move || {
            let id = store.place(&dev, false)?;
            for (b, data) in rows {
                write_chunks(r, id, base + b, &data)?;
            }
            store.written(&dev);
            Ok(())
        })
    })
}

/// Whether a rectangular copy within one buffer (row pitch `rp`, slice pitch `sp`) from
/// box `src` to box `dst` of size `region` overlaps, as the OpenCL specification's overlap
/// test decides it (the boxes intersect, or one wraps past a row or slice into the other's
/// span).
fn boxes_overlap(src: [usize; 3], dst: [usize; 3], region: [usize; 3], rp: usize, sp: usize) -> bool {
    if (0..3).all(|i| src[i] < dst[i] + region[i] && dst[i] < src[i] + region[i]) {
        return true;
    }
    let start = |o: [usize; 3]| o[2] * sp + o[1] * rp + o[0];
    let extent = region[2] * sp + region[1] * rp + region[0];
    let (s0, d0) = (start(src), start(dst));
    let spans_meet = (s0 <= d0 && d0 < s0 + extent) || (d0 <= s0 && s0 < d0 + extent);
    // How far a box runs past the end of its row (x) or slice (y).
    let past = |o: usize, n: usize, room: usize| (o + n).saturating_sub(room);
    let wraps_x = past(src[0], region[0], rp) > dst[0] || past(dst[0], region[0], rp) > src[0];
    let height = sp.checked_div(rp).unwrap_or(0);
    let wraps_y = region[2] > 1 && (past(src[1], region[1], height) > dst[1] || past(dst[1], region[1], height) > src[1]);
    (wraps_x || wraps_y) && spans_meet
}

unsafe extern "C" fn cl_enqueue_copy_buffer_rect(
    q: Handle,
    src: Handle,
    dst: Handle,
    src_origin: *const usize,
    dst_origin: *const usize,
    region: *const usize,
    srp: usize,
    ssp: usize,
    drp: usize,
    dsp: usize,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, s) = queue_mem(q, src)?;
        let (_, d) = queue_mem(q.handle(), dst)?;
        let (so, dof, reg) = (three(src_origin)?, three(dst_origin)?, three(region)?);
        let rc = rect(s.size, d.size, so, dof, reg, srp, ssp, drp, dsp)?;
        if s.same(&d) {
            // One buffer: one geometry, and the specification's test of the two boxes.
            let row = |p: usize| if p == 0 { reg[0] } else { p };
            let (rp, drp) = (row(srp), row(drp));
            let (sp, dsp) = (if ssp == 0 { reg[1] * rp } else { ssp }, if dsp == 0 { reg[1] * drp } else { dsp });
            if rp != drp && sp != dsp {
                return Err(cl::INVALID_VALUE);
            }
            if boxes_overlap(so, dof, reg, rp, sp) {
                return Err(cl::MEM_COPY_OVERLAP);
            }
        } else if Arc::ptr_eq(&s.store, &d.store) {
            let overlap = rc.rows.iter().any(|(a, _)| {
                rc.rows.iter().any(|(_, b)| {
                    let (a, b) = (s.base + a, d.base + b);
                    a < b + rc.width && b < a + rc.width
                })
            });
            if overlap {
                return Err(cl::MEM_COPY_OVERLAP);
            }
        }
        let dev = q.device.clone();
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_COPY_BUFFER_RECT, false, move || {
            let si = s.store.place(&dev, false)?;
            let di = d.store.place(&dev, false)?;
            for (a, b) in &rc.rows {
                let cmd = Command::Copy {
                    src: si,
                    src_offset: (s.base + a) as u64,
                    dst: di,
                    dst_offset: (d.base + b) as u64,
                    len: rc.width as u64,
                };
                r.post_raw(cmd).map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
            }
            d.store.written(&dev);
            Ok(())
        })
    })
}

unsafe extern "C" fn cl_enqueue_map_buffer(
    q: Handle,
    mem: Handle,
    blocking: Uint,
    flags: u64,
    offset: usize,
    size: usize,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
    errcode: *mut Int,
) -> *mut c_void {
    error::create(errcode, || {
        let (q, m) = queue_mem(q, mem)?;
        if size == 0 || flags & !(cl::MAP_READ | cl::MAP_WRITE | cl::MAP_WRITE_INVALIDATE_REGION) != 0 {
            return Err(cl::INVALID_VALUE);
        }
        if flags & cl::MAP_WRITE_INVALIDATE_REGION != 0 && flags & (cl::MAP_READ | cl::MAP_WRITE) != 0 {
            return Err(cl::INVALID_VALUE);
        }
        m.check(offset, size)?;
        // The mapped memory exists now (the pointer is returned at once, as the
        // specification requires of a non-blocking map); the bytes arrive when the command
        // runs. USE_HOST_PTR buffers map to the application's own memory.
        let (p, owned) = if m.host_ptr != 0 {
            ((m.host_ptr + offset) as *mut u8, None)
        } else {
            let mut v = vec![0u8; size];
            (v.as_mut_ptr(), Some(v))
        };
        lock(&m.maps).insert(p as usize, Mapping { offset, size, flags, owned });
        let (dev, mm, dst) = (q.device.clone(), m.clone(), HostPtr(p as usize));
        let r = q.remote();
        let done = enqueue(&q, nwait, wait, event, cl::COMMAND_MAP_BUFFER, blocking != 0, move || {
            if flags & cl::MAP_WRITE_INVALIDATE_REGION == 0 {
                let id = mm.store.place(&dev, false)?;
                let data = read_chunks(r, id, mm.base + offset, size)?;
                // SAFETY: the mapping's memory: `size` bytes owned by the mapping (kept until
                // it is unmapped) or the application's USE_HOST_PTR memory.
                unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst.get(), size) };
            }
            Ok(())
        });
        if let Err(e) = done {
            lock(&m.maps).remove(&(p as usize));
            return Err(e);
        }
        Ok(p.cast())
    })
}

unsafe extern "C" fn cl_enqueue_unmap_mem_object(
    q: Handle,
    mem: Handle,
    mapped: *mut c_void,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let (q, m) = queue_mem(q, mem)?;
        let mapping = lock(&m.maps).remove(&(mapped as usize)).ok_or(cl::INVALID_VALUE)?;
        let (dev, mm, mapped) = (q.device.clone(), m.clone(), HostPtr::of(mapped));
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_UNMAP_MEM_OBJECT, false, move || {
            if mapping.flags & (cl::MAP_WRITE | cl::MAP_WRITE_INVALIDATE_REGION) != 0 {
                // SAFETY: the mapping's memory: `size` bytes, owned here or the application's
                // USE_HOST_PTR memory.
                let data = unsafe { std::slice::from_raw_parts(mapped.get(), mapping.size) }.to_vec();
                let id = mm.store.place(&dev, false)?;
                write_chunks(r, id, mm.base + mapping.offset, &data)?;
                mm.store.written(&dev);
            }
            drop(mapping.owned);
            Ok(())
        })
    })
}

unsafe extern "C" fn cl_enqueue_migrate_mem_objects(
    q: Handle,
    n: Uint,
    mems: *const Handle,
    flags: u64,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let q: Ref<Queue> = obj(q, cl::INVALID_COMMAND_QUEUE)?;
        if n == 0 || flags & !(cl::MIGRATE_MEM_OBJECT_HOST | cl::MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED) != 0 {
            return Err(cl::INVALID_VALUE);
        }
        let mut ms = Vec::new();
        for h in list(n, mems)? {
            let m: Ref<Mem> = obj(*h, cl::INVALID_MEM_OBJECT)?;
            if !m.ctx.same(&q.ctx) {
                return Err(cl::INVALID_CONTEXT);
            }
            ms.push(m);
        }
        let dev = q.device.clone();
        enqueue(&q, nwait, wait, event, cl::COMMAND_MIGRATE_MEM_OBJECTS, false, move || {
            if flags & cl::MIGRATE_MEM_OBJECT_HOST == 0 {
                for m in &ms {
                    m.store.place(&dev, flags & cl::MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED != 0)?;
                }
            }
            Ok(())
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Programs

unsafe extern "C" fn cl_create_program_with_source(
    ctx: Handle,
    n: Uint,
    strings: *const *const c_char,
    lengths: *const usize,
    errcode: *mut Int,
) -> Handle {
    error::create(errcode, || {
        let c: Ref<Context> = obj(ctx, cl::INVALID_CONTEXT)?;
        if n == 0 || strings.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let mut source = String::new();
        for i in 0..n as usize {
            // SAFETY: `n` string pointers, each NUL-terminated or with its length given.
            let s = unsafe { *strings.add(i) };
            if s.is_null() {
                return Err(cl::INVALID_VALUE);
            }
            // SAFETY: as above.
            let len = if lengths.is_null() { 0 } else { unsafe { *lengths.add(i) } };
            let b = if len == 0 {
                // SAFETY: NUL-terminated.
                unsafe { CStr::from_ptr(s) }.to_bytes()
            } else {
                // SAFETY: `len` bytes.
                unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) }
            };
            source.push_str(&String::from_utf8_lossy(b));
        }
        Ok(Ref::new(Program { ctx: c, source, builds: Mutex::new(Default::default()), kernels: Default::default() }).into_handle())
    })
}

unsafe extern "C" fn cl_create_program_with_binary(
    ctx: Handle,
    n: Uint,
    devices: *const Handle,
    _lengths: *const usize,
    _binaries: *const *const u8,
    binary_status: *mut Int,
    errcode: *mut Int,
) -> Handle {
    error::create(errcode, || {
        obj::<Context>(ctx, cl::INVALID_CONTEXT)?;
        if n == 0 || devices.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        for i in 0..n as usize {
            if !binary_status.is_null() {
                // SAFETY: room for `n` statuses.
                unsafe { *binary_status.add(i) = cl::INVALID_BINARY };
            }
        }
        Err(cl::INVALID_BINARY) // programs are built from source on the daemons
    })
}

unsafe extern "C" fn cl_create_program_with_built_in_kernels(
    ctx: Handle,
    _n: Uint,
    _d: *const Handle,
    _names: *const c_char,
    errcode: *mut Int,
) -> Handle {
    error::create(errcode, || {
        obj::<Context>(ctx, cl::INVALID_CONTEXT)?;
        Err(cl::INVALID_VALUE) // no device lists built-in kernels
    })
}

fn program_devices(p: &Program, n: Uint, devices: *const Handle) -> R<Vec<Ref<Device>>> {
    if (n == 0) != devices.is_null() {
        return Err(cl::INVALID_VALUE);
    }
    if n == 0 {
        return Ok(p.ctx.devices.clone());
    }
    let mut out = Vec::new();
    for h in list(n, devices)? {
        let d: Ref<Device> = obj(*h, cl::INVALID_DEVICE)?;
        if !p.ctx.has(&d) {
            return Err(cl::INVALID_DEVICE);
        }
        out.push(d);
    }
    Ok(out)
}

unsafe extern "C" fn cl_build_program(
    program: Handle,
    n: Uint,
    devices: *const Handle,
    options: *const c_char,
    notify: Option<cl::ProgramCallback>,
    user: *mut c_void,
) -> Int {
    status(|| {
        let p: Ref<Program> = obj(program, cl::INVALID_PROGRAM)?;
        if notify.is_none() && !user.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let ds = program_devices(&p, n, devices)?;
        // A linked program has no source to build again.
        if p.source.is_empty() || p.kernels.load(Ordering::Acquire) > 0 {
            return Err(cl::INVALID_OPERATION);
        }
        let r = p.build(&ds, &options_of(options));
        if let Some(f) = notify {
            // SAFETY: the application's build callback with its data; the build is over.
            error::guard((), || unsafe { f(p.handle(), user) });
        }
        r
    })
}

/// An option string (null: none).
fn options_of(options: *const c_char) -> String {
    if options.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated option string.
        unsafe { CStr::from_ptr(options) }.to_string_lossy().into_owned()
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn cl_compile_program(
    program: Handle,
    n: Uint,
    devices: *const Handle,
    options: *const c_char,
    nheaders: Uint,
    headers: *const Handle,
    names: *const *const c_char,
    notify: Option<cl::ProgramCallback>,
    user: *mut c_void,
) -> Int {
    status(|| {
        let p: Ref<Program> = obj(program, cl::INVALID_PROGRAM)?;
        if (notify.is_none() && !user.is_null()) || (nheaders == 0) != headers.is_null() || (nheaders == 0) != names.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let ds = program_devices(&p, n, devices)?;
        let mut embedded = Vec::with_capacity(nheaders as usize);
        for (i, h) in list(nheaders, headers)?.iter().enumerate() {
            let header: Ref<Program> = obj(*h, cl::INVALID_VALUE)?;
            // SAFETY: `nheaders` include names, each NUL-terminated (checked non-null).
            let name = unsafe { *names.add(i) };
            if name.is_null() {
                return Err(cl::INVALID_VALUE);
            }
            // SAFETY: as above.
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
            embedded.push((name, header.source.clone()));
        }
        if p.source.is_empty() || p.kernels.load(Ordering::Acquire) > 0 {
            return Err(cl::INVALID_OPERATION); // a linked program has no source to compile
        }
        let r = p.compile(&ds, &options_of(options), &embedded);
        if let Some(f) = notify {
            // SAFETY: the application's callback with its data; the compilation is over.
            error::guard((), || unsafe { f(p.handle(), user) });
        }
        r
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn cl_link_program(
    ctx: Handle,
    n: Uint,
    devices: *const Handle,
    options: *const c_char,
    nprograms: Uint,
    programs: *const Handle,
    notify: Option<cl::ProgramCallback>,
    user: *mut c_void,
    errcode: *mut Int,
) -> Handle {
    let mut code = cl::SUCCESS;
    let h = error::create(errcode, || {
        let c: Ref<Context> = obj(ctx, cl::INVALID_CONTEXT)?;
        if (notify.is_none() && !user.is_null()) || nprograms == 0 || programs.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let mut inputs = Vec::with_capacity(nprograms as usize);
        for h in list(nprograms, programs)? {
            let p: Ref<Program> = obj(*h, cl::INVALID_PROGRAM)?;
            if !p.ctx.same(&c) {
                return Err(cl::INVALID_PROGRAM);
            }
            inputs.push(p);
        }
        let linked = Ref::new(Program::linked(c));
        let ds = program_devices(&linked, n, devices)?;
        match linked.link(&ds, &options_of(options), &inputs) {
            Ok(()) => {}
            // The program is returned, with its log, when the link itself failed.
            Err(cl::LINK_PROGRAM_FAILURE) => code = cl::LINK_PROGRAM_FAILURE,
            Err(e) => return Err(e),
        }
        if let Some(f) = notify {
            // SAFETY: the application's callback with its data; the link is over.
            error::guard((), || unsafe { f(linked.handle(), user) });
        }
        Ok(linked.into_handle())
    });
    if !h.is_null() && code != cl::SUCCESS {
        put(errcode, code);
    }
    h
}

unsafe extern "C" fn cl_unload_compiler() -> Int {
    cl::SUCCESS
}

unsafe extern "C" fn cl_unload_platform_compiler(platform: Handle) -> Int {
    status(|| the_platform(platform).map(|_| ()))
}

unsafe extern "C" fn cl_get_program_info(program: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let p: Ref<Program> = obj(program, cl::INVALID_PROGRAM)?;
        let built = || p.any_built().ok_or(cl::INVALID_PROGRAM_EXECUTABLE);
        let v = match param {
            cl::PROGRAM_REFERENCE_COUNT => bytes(p.count()),
            cl::PROGRAM_CONTEXT => bytes(p.ctx.handle()),
            cl::PROGRAM_NUM_DEVICES => bytes(p.ctx.devices.len() as Uint),
            cl::PROGRAM_DEVICES => handles(&p.ctx.devices),
            cl::PROGRAM_SOURCE => cstr(&p.source),
            cl::PROGRAM_BINARY_SIZES => p.ctx.devices.iter().flat_map(|_| 0usize.to_ne_bytes()).collect(),
            cl::PROGRAM_BINARIES => Vec::new(),
            cl::PROGRAM_IL => Vec::new(),
            cl::PROGRAM_NUM_KERNELS | cl::PROGRAM_KERNEL_NAMES => {
                let (d, id) = built()?;
                query(platform::get().ok_or(cl::INVALID_PROGRAM)?.remote(&d), cl_query::PROGRAM, id, d.index, param)?
            }
            cl::PROGRAM_SCOPE_GLOBAL_CTORS_PRESENT | cl::PROGRAM_SCOPE_GLOBAL_DTORS_PRESENT => bytes(0u32),
            _ => return Err(cl::INVALID_VALUE),
        };
        answer(&v, size, value, ret)
    })
}

unsafe extern "C" fn cl_get_program_build_info(
    program: Handle,
    device: Handle,
    param: Uint,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> Int {
    status(|| {
        let p: Ref<Program> = obj(program, cl::INVALID_PROGRAM)?;
        let d: Ref<Device> = obj(device, cl::INVALID_DEVICE)?;
        if !p.ctx.has(&d) {
            return Err(cl::INVALID_DEVICE);
        }
        let b = lock(&p.builds).get(&pos(&d)).cloned();
        let v = match param {
            cl::PROGRAM_BUILD_STATUS => bytes(b.as_ref().map_or(cl::BUILD_NONE, |b| b.status)),
            cl::PROGRAM_BUILD_OPTIONS => cstr(b.as_ref().map_or("", |b| &b.options)),
            cl::PROGRAM_BUILD_LOG => cstr(b.as_ref().map_or("", |b| &b.log)),
            cl::PROGRAM_BINARY_TYPE => bytes(b.as_ref().map_or(cl::PROGRAM_BINARY_TYPE_NONE, |b| b.binary)),
            cl::PROGRAM_BUILD_GLOBAL_VARIABLE_TOTAL_SIZE => bytes(0usize),
            _ => return Err(cl::INVALID_VALUE),
        };
        answer(&v, size, value, ret)
    })
}

// ---------------------------------------------------------------------------------------------
// Kernels

fn make_kernel(p: Ref<Program>, name: &str) -> R<Ref<Kernel>> {
    let (d, id) = p.any_built().ok_or(cl::INVALID_PROGRAM_EXECUTABLE)?;
    let (kid, quals, read_only) = Kernel::make(&d, id, name)?;
    p.kernels.fetch_add(1, Ordering::AcqRel);
    let mut ids = std::collections::HashMap::new();
    ids.insert(pos(&d), kid);
    Ok(Ref::new(Kernel {
        program: p,
        name: name.into(),
        args: Mutex::new(vec![None; quals.len()]),
        quals,
        read_only,
        ids: Mutex::new(ids),
        value_sizes: Mutex::default(),
    }))
}

unsafe extern "C" fn cl_create_kernel(program: Handle, name: *const c_char, errcode: *mut Int) -> Handle {
    error::create(errcode, || {
        let p: Ref<Program> = obj(program, cl::INVALID_PROGRAM)?;
        if name.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated kernel name.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        Ok(make_kernel(p, &name)?.into_handle())
    })
}

unsafe extern "C" fn cl_create_kernels_in_program(program: Handle, n: Uint, kernels: *mut Handle, num: *mut Uint) -> Int {
    status(|| {
        let p: Ref<Program> = obj(program, cl::INVALID_PROGRAM)?;
        let (d, id) = p.any_built().ok_or(cl::INVALID_PROGRAM_EXECUTABLE)?;
        let names =
            text(&query(platform::get().ok_or(cl::INVALID_PROGRAM)?.remote(&d), cl_query::PROGRAM, id, d.index, cl::PROGRAM_KERNEL_NAMES)?);
        let names: Vec<&str> = names.split(';').filter(|s| !s.is_empty()).collect();
        if !kernels.is_null() && (n as usize) < names.len() {
            return Err(cl::INVALID_VALUE);
        }
        put(num, names.len() as Uint);
        if !kernels.is_null() {
            for (i, name) in names.iter().enumerate() {
                let k = make_kernel(p.clone(), name)?;
                // SAFETY: room for `n` >= names.len() handles.
                unsafe { *kernels.add(i) = k.into_handle() };
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn cl_set_kernel_arg(kernel: Handle, index: Uint, size: usize, value: *const c_void) -> Int {
    status(|| {
        let k: Ref<Kernel> = obj(kernel, cl::INVALID_KERNEL)?;
        let qual = *k.quals.get(index as usize).ok_or(cl::INVALID_ARG_INDEX)?;
        let handle_size = std::mem::size_of::<Handle>();
        let as_mem = |must: bool| -> R<ArgVal> {
            if size != handle_size {
                return Err(cl::INVALID_ARG_SIZE);
            }
            // SAFETY: a cl_mem-sized value (checked), or null.
            let h = if value.is_null() { ptr::null_mut() } else { unsafe { *value.cast::<Handle>() } };
            if h.is_null() {
                return Ok(ArgVal::NullMem);
            }
            match Ref::<Mem>::from_handle(h) {
                Some(m) if m.ctx.same(&k.program.ctx) => Ok(ArgVal::Mem(m.handle() as usize)),
                Some(_) => Err(cl::INVALID_MEM_OBJECT),
                None if must => Err(cl::INVALID_MEM_OBJECT),
                None => Err(cl::INVALID_ARG_VALUE),
            }
        };
        let v = match qual {
            cl::KERNEL_ARG_ADDRESS_LOCAL => {
                if !value.is_null() {
                    return Err(cl::INVALID_ARG_VALUE);
                }
                if size == 0 {
                    return Err(cl::INVALID_ARG_SIZE);
                }
                ArgVal::Local(size)
            }
            cl::KERNEL_ARG_ADDRESS_GLOBAL | cl::KERNEL_ARG_ADDRESS_CONSTANT => as_mem(true)?,
            _ => {
                if value.is_null() {
                    if qual == 0 && size > 0 {
                        ArgVal::Local(size) // an unknown qualifier with a null value: __local
                    } else {
                        return Err(cl::INVALID_ARG_VALUE);
                    }
                } else if size == 0 || size > wire::MAX_ARG_BYTES {
                    return Err(cl::INVALID_ARG_SIZE);
                } else if qual == 0 && size == handle_size {
                    // The platform could not say (kernels of linked programs come without
                    // argument info): a live buffer handle is a buffer; anything else, zero
                    // included, goes by value, which the platform reads as a null buffer or as
                    // the number, whichever the argument is.
                    match as_mem(false) {
                        Ok(mem @ ArgVal::Mem(_)) => mem,
                        // SAFETY: `size` readable bytes.
                        _ => ArgVal::Value(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()),
                    }
                } else {
                    if qual == cl::KERNEL_ARG_ADDRESS_PRIVATE && value_size(&k, index).is_some_and(|want| want != size) {
                        return Err(cl::INVALID_ARG_SIZE);
                    }
                    // SAFETY: `size` readable bytes.
                    ArgVal::Value(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec())
                }
            }
        };
        lock(&k.args)[index as usize] = Some(v);
        Ok(())
    })
}

/// The size in bytes of by-value argument `index` of `k`, from its type name as the daemon's
/// platform reports it (asked once per argument); `None` for types whose size this side
/// cannot tell (structures, `size_t`, ...), which the daemon checks at launch instead.
fn value_size(k: &Ref<Kernel>, index: Uint) -> Option<usize> {
    if let Some(known) = lock(&k.value_sizes).get(&index) {
        return *known;
    }
    let size = kernel_query(k, None, cl_query::KERNEL_ARG, Some(index), cl::KERNEL_ARG_TYPE_NAME).ok().and_then(|name| type_size(&name));
    lock(&k.value_sizes).insert(index, size);
    size
}

/// The size of an OpenCL C scalar or vector type named `name` (NUL-terminated or not).
pub(crate) fn type_size(name: &[u8]) -> Option<usize> {
    let name = std::str::from_utf8(name).ok()?.trim_end_matches('\0').trim();
    let digits = name.find(|c: char| c.is_ascii_digit()).unwrap_or(name.len());
    let (base, lanes) = name.split_at(digits);
    let scalar = match base {
        "char" | "uchar" => 1,
        "short" | "ushort" | "half" => 2,
        "int" | "uint" | "float" => 4,
        "long" | "ulong" | "double" => 8,
        _ => return None,
    };
    let lanes = match lanes {
        "" => 1,
        "2" => 2,
        "3" | "4" => 4, // a 3-vector takes the room of a 4-vector
        "8" => 8,
        "16" => 16,
        _ => return None,
    };
    Some(scalar * lanes)
}

fn kernel_query(k: &Ref<Kernel>, d: Option<&Ref<Device>>, what: u8, dev_or_arg: Option<u32>, param: Uint) -> R<Vec<u8>> {
    let p = platform::get().ok_or(cl::INVALID_KERNEL)?;
    let d = match d {
        Some(d) => d.clone(),
        None => k.program.any_built().ok_or(cl::INVALID_PROGRAM_EXECUTABLE)?.0,
    };
    let id = k.on(&d)?;
    query(p.remote(&d), what, id, dev_or_arg.unwrap_or(d.index), param)
}

unsafe extern "C" fn cl_get_kernel_info(kernel: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let k: Ref<Kernel> = obj(kernel, cl::INVALID_KERNEL)?;
        let v = match param {
            cl::KERNEL_FUNCTION_NAME => cstr(&k.name),
            cl::KERNEL_NUM_ARGS => bytes(k.quals.len() as Uint),
            cl::KERNEL_REFERENCE_COUNT => bytes(k.count()),
            cl::KERNEL_CONTEXT => bytes(k.program.ctx.handle()),
            cl::KERNEL_PROGRAM => bytes(k.program.handle()),
            _ => kernel_query(&k, None, cl_query::KERNEL, None, param)?,
        };
        answer(&v, size, value, ret)
    })
}

unsafe extern "C" fn cl_get_kernel_work_group_info(
    kernel: Handle,
    device: Handle,
    param: Uint,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> Int {
    status(|| {
        let k: Ref<Kernel> = obj(kernel, cl::INVALID_KERNEL)?;
        let d = if device.is_null() {
            if k.program.ctx.devices.len() != 1 {
                return Err(cl::INVALID_DEVICE);
            }
            k.program.ctx.devices[0].clone()
        } else {
            obj(device, cl::INVALID_DEVICE)?
        };
        if !k.program.ctx.has(&d) {
            return Err(cl::INVALID_DEVICE);
        }
        let v = kernel_query(&k, Some(&d), cl_query::KERNEL_WORK_GROUP, None, param)?;
        answer(&v, size, value, ret)
    })
}

unsafe extern "C" fn cl_get_kernel_arg_info(
    kernel: Handle,
    index: Uint,
    param: Uint,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> Int {
    status(|| {
        let k: Ref<Kernel> = obj(kernel, cl::INVALID_KERNEL)?;
        if index as usize >= k.quals.len() {
            return Err(cl::INVALID_ARG_INDEX);
        }
        let v = kernel_query(&k, None, cl_query::KERNEL_ARG, Some(index), param)?;
        answer(&v, size, value, ret)
    })
}

/// A kernel argument as a launch holds it.
enum Launched {
    Mem(Ref<Mem>),
    NullMem,
    Value(Vec<u8>),
    Local(usize),
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn cl_enqueue_nd_range_kernel(
    q: Handle,
    kernel: Handle,
    dims: Uint,
    offset: *const usize,
    global: *const usize,
    local: *const usize,
    nwait: Uint,
    wait: *const Handle,
    event: *mut Handle,
) -> Int {
    status(|| {
        let q: Ref<Queue> = obj(q, cl::INVALID_COMMAND_QUEUE)?;
        let k: Ref<Kernel> = obj(kernel, cl::INVALID_KERNEL)?;
        if !k.program.ctx.same(&q.ctx) {
            return Err(cl::INVALID_CONTEXT);
        }
        if !(1..=3).contains(&dims) {
            return Err(cl::INVALID_WORK_DIMENSION);
        }
        if global.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let n = dims as usize;
        let read = |p: *const usize, fill: u64| -> [u64; 3] {
            let mut v = [fill; 3];
            if !p.is_null() {
                for (i, x) in v.iter_mut().take(n).enumerate() {
                    // SAFETY: the application passes `dims` size_t values.
                    *x = unsafe { *p.add(i) } as u64;
                }
            }
            v
        };
        let (off, glob) = (read(offset, 0), read(global, 1));
        let loc = if local.is_null() { [0; 3] } else { read(local, 1) };
        if glob[..n].contains(&0) {
            return Err(cl::INVALID_GLOBAL_WORK_SIZE);
        }
        let p = platform::get().ok_or(cl::INVALID_COMMAND_QUEUE)?;
        if !local.is_null() {
            let max_wg = q.device.info_num(p, cl::DEVICE_MAX_WORK_GROUP_SIZE)?;
            let items = q.device.max_item_sizes(p)?;
            if loc[..n].contains(&0) || loc.iter().product::<u64>() > max_wg || (0..n).any(|i| glob[i] % loc[i] != 0) {
                return Err(cl::INVALID_WORK_GROUP_SIZE);
            }
            if (0..n).any(|i| items.get(i).is_some_and(|m| loc[i] > *m)) {
                return Err(cl::INVALID_WORK_ITEM_SIZE);
            }
        }
        if k.program.built(&q.device).is_none() {
            return Err(cl::INVALID_PROGRAM_EXECUTABLE);
        }
        let set: Vec<ArgVal> = lock(&k.args).iter().cloned().collect::<Option<Vec<_>>>().ok_or(cl::INVALID_KERNEL_ARGS)?;
        // The launch keeps the buffers it uses until it has been posted.
        let mut args = Vec::with_capacity(set.len());
        for a in set {
            args.push(match a {
                ArgVal::Mem(h) => Launched::Mem(Ref::<Mem>::from_handle(h as Handle).ok_or(cl::INVALID_KERNEL_ARGS)?),
                ArgVal::NullMem => Launched::NullMem,
                ArgVal::Value(v) => Launched::Value(v),
                ArgVal::Local(n) => Launched::Local(n),
            });
        }
        let kid = k.on(&q.device)?;
        let (dev, qid) = (q.device.clone(), q.id);
        let r = q.remote();
        enqueue(&q, nwait, wait, event, cl::COMMAND_NDRANGE_KERNEL, false, move || {
            // The launch keeps its kernel until it has been posted: the application may
            // release the kernel while the launch is held behind a user event, and releasing
            // it frees the daemon's kernel (posted after the launch, it runs after it there).
            let _kernel = &k;
            let mut wire_args = Vec::with_capacity(args.len());
            for a in &args {
                wire_args.push(match a {
                    Launched::Mem(m) => {
                        let id = m.store.place(&dev, false)?;
                        let whole = m.base == 0 && m.size == m.store.size;
                        if whole {
                            ClArg::Mem { buffer: id, offset: 0, len: 0 }
                        } else {
                            ClArg::Mem { buffer: id, offset: m.base as u64, len: m.size as u64 }
                        }
                    }
                    Launched::NullMem => ClArg::NullMem,
                    Launched::Value(v) => ClArg::Value(v.clone()),
                    Launched::Local(s) => ClArg::Local(*s as u64),
                });
            }
            let cmd =
                Command::ClLaunch { queue: qid, kernel: kid, dims: dims as u8, offset: off, global: glob, local: loc, args: wire_args };
            r.post_raw(cmd).map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
            for (i, a) in args.iter().enumerate() {
                if let Launched::Mem(m) = a {
                    if m.flags & cl::MEM_READ_ONLY == 0 && !k.read_only.get(i).copied().unwrap_or(false) {
                        m.store.written(&dev);
                    }
                }
            }
            Ok(())
        })
    })
}

unsafe extern "C" fn cl_enqueue_task(q: Handle, kernel: Handle, nwait: Uint, wait: *const Handle, event: *mut Handle) -> Int {
    let one = [1usize; 3];
    // SAFETY: forwards the application's arguments with a 1x1x1 range.
    unsafe { cl_enqueue_nd_range_kernel(q, kernel, 1, ptr::null(), one.as_ptr(), one.as_ptr(), nwait, wait, event) }
}

unsafe extern "C" fn cl_enqueue_native_kernel(q: Handle) -> Int {
    status(|| {
        obj::<Queue>(q, cl::INVALID_COMMAND_QUEUE)?;
        Err(cl::INVALID_OPERATION) // CL_DEVICE_EXECUTION_CAPABILITIES has no native kernels
    })
}

// ---------------------------------------------------------------------------------------------
// Events

unsafe extern "C" fn cl_enqueue_marker_with_wait_list(q: Handle, nwait: Uint, wait: *const Handle, event: *mut Handle) -> Int {
    status(|| {
        let q: Ref<Queue> = obj(q, cl::INVALID_COMMAND_QUEUE)?;
        enqueue(&q, nwait, wait, event, cl::COMMAND_MARKER, false, || Ok(()))
    })
}

unsafe extern "C" fn cl_enqueue_barrier_with_wait_list(q: Handle, nwait: Uint, wait: *const Handle, event: *mut Handle) -> Int {
    status(|| {
        let q: Ref<Queue> = obj(q, cl::INVALID_COMMAND_QUEUE)?;
        enqueue(&q, nwait, wait, event, cl::COMMAND_BARRIER, false, || Ok(()))
    })
}

unsafe extern "C" fn cl_enqueue_marker(q: Handle, event: *mut Handle) -> Int {
    if event.is_null() {
        return cl::INVALID_VALUE;
    }
    // SAFETY: forwards the application's arguments.
    unsafe { cl_enqueue_marker_with_wait_list(q, 0, ptr::null(), event) }
}

unsafe extern "C" fn cl_enqueue_barrier(q: Handle) -> Int {
    // SAFETY: forwards the application's queue.
    unsafe { cl_enqueue_barrier_with_wait_list(q, 0, ptr::null(), ptr::null_mut()) }
}

unsafe extern "C" fn cl_enqueue_wait_for_events(q: Handle, n: Uint, list: *const Handle) -> Int {
    if n == 0 || list.is_null() {
        return cl::INVALID_VALUE;
    }
    // SAFETY: forwards the application's arguments.
    unsafe { cl_enqueue_barrier_with_wait_list(q, n, list, ptr::null_mut()) }
}

unsafe extern "C" fn cl_wait_for_events(n: Uint, events: *const Handle) -> Int {
    status(|| {
        if n == 0 || events.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let mut evs: Vec<Ref<Event>> = Vec::new();
        for h in list(n, events)? {
            let e: Ref<Event> = obj(*h, cl::INVALID_EVENT)?;
            if evs.first().is_some_and(|f| !f.ctx.same(&e.ctx)) {
                return Err(cl::INVALID_CONTEXT);
            }
            evs.push(e);
        }
        let mut failed = false;
        for e in &evs {
            failed |= resolve(e) < 0;
        }
        if failed {
            Err(cl::EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        } else {
            Ok(())
        }
    })
}

unsafe extern "C" fn cl_get_event_info(event: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let e: Ref<Event> = obj(event, cl::INVALID_EVENT)?;
        let v = match param {
            cl::EVENT_COMMAND_QUEUE => bytes(e.queue.as_ref().map_or(ptr::null_mut(), |q| q.handle())),
            cl::EVENT_CONTEXT => bytes(e.ctx.handle()),
            cl::EVENT_COMMAND_TYPE => bytes(e.command),
            cl::EVENT_REFERENCE_COUNT => bytes(e.count()),
            cl::EVENT_COMMAND_EXECUTION_STATUS => {
                // A posted command is asked about (the daemon answers once it has run).
                let s = e.status();
                bytes(if s == cl::SUBMITTED && !e.is_user() { resolve(&e) } else { s })
            }
            _ => return Err(cl::INVALID_VALUE),
        };
        answer(&v, size, value, ret)
    })
}

unsafe extern "C" fn cl_create_user_event(ctx: Handle, errcode: *mut Int) -> Handle {
    error::create(errcode, || {
        let c: Ref<Context> = obj(ctx, cl::INVALID_CONTEXT)?;
        Ok(Event::new(c, None, cl::COMMAND_USER, cl::SUBMITTED, false).into_handle())
    })
}

unsafe extern "C" fn cl_set_user_event_status(event: Handle, st: Int) -> Int {
    status(|| {
        let e: Ref<Event> = obj(event, cl::INVALID_EVENT)?;
        if !e.is_user() || st > cl::COMPLETE {
            return Err(cl::INVALID_VALUE);
        }
        if e.status() <= cl::COMPLETE {
            return Err(cl::INVALID_OPERATION);
        }
        set_status(&e, st);
        pump_all();
        Ok(())
    })
}

unsafe extern "C" fn cl_set_event_callback(event: Handle, trigger: Int, f: Option<cl::EventCallback>, user: *mut c_void) -> Int {
    status(|| {
        let e: Ref<Event> = obj(event, cl::INVALID_EVENT)?;
        let f = f.ok_or(cl::INVALID_VALUE)?;
        if ![cl::COMPLETE, cl::RUNNING, cl::SUBMITTED].contains(&trigger) {
            return Err(cl::INVALID_VALUE);
        }
        let now = {
            let mut s = lock(&e.state);
            // Posted commands count as running: the daemon runs them as they arrive.
            let reached = s.status <= trigger || (trigger != cl::COMPLETE && s.status == cl::SUBMITTED && !e.is_user());
            if reached {
                Some(s.status)
            } else {
                s.callbacks.push((trigger, f, user as usize));
                None
            }
        };
        match now {
            Some(st) => {
                let (h, u) = (e.handle() as usize, user as usize);
                let e2 = e.clone();
                let _ = std::thread::Builder::new().name("sucl-cl-callback".into()).spawn(move || {
                    let _keep = e2;
                    // SAFETY: the application's callback, with its event and data.
                    error::guard((), || unsafe { f(h as Handle, st, u as *mut c_void) });
                });
            }
            None => watch(&e),
        }
        Ok(())
    })
}

unsafe extern "C" fn cl_get_event_profiling_info(event: Handle, param: Uint, size: usize, value: *mut c_void, ret: *mut usize) -> Int {
    status(|| {
        let e: Ref<Event> = obj(event, cl::INVALID_EVENT)?;
        if !e.timed {
            return Err(cl::PROFILING_INFO_NOT_AVAILABLE);
        }
        let i = match param {
            cl::PROFILING_COMMAND_QUEUED => 0,
            cl::PROFILING_COMMAND_SUBMIT => 1,
            cl::PROFILING_COMMAND_START => 2,
            cl::PROFILING_COMMAND_END | cl::PROFILING_COMMAND_COMPLETE => 3,
            _ => return Err(cl::INVALID_VALUE),
        };
        if resolve(&e) != cl::COMPLETE {
            return Err(cl::PROFILING_INFO_NOT_AVAILABLE);
        }
        let cached = lock(&e.state).profile;
        let t = match cached {
            Some(t) => t,
            None => {
                let (srv, id) = lock(&e.state).server.ok_or(cl::PROFILING_INFO_NOT_AVAILABLE)?;
                let p = platform::get().ok_or(cl::INVALID_EVENT)?;
                let v = query(&p.servers[srv].remote, cl_query::EVENT_PROFILE, id, 0, 0).map_err(|_| cl::PROFILING_INFO_NOT_AVAILABLE)?;
                let mut t = [0u64; 4];
                for (x, c) in t.iter_mut().zip(v.chunks_exact(8)) {
                    *x = u64::from_le_bytes(c.try_into().expect("8 bytes"));
                }
                lock(&e.state).profile = Some(t);
                t
            }
        };
        answer(&bytes(t[i]), size, value, ret)
    })
}

// ---------------------------------------------------------------------------------------------
// Images, samplers and other things not offered

unsafe extern "C" fn cl_refuse_image(
    ctx: Handle,
    _flags: u64,
    _a: *const c_void,
    _b: *const c_void,
    _c: *mut c_void,
    errcode: *mut Int,
) -> Handle {
    error::create(errcode, || {
        obj::<Context>(ctx, cl::INVALID_CONTEXT)?;
        Err(cl::INVALID_OPERATION) // CL_DEVICE_IMAGE_SUPPORT is false on every device
    })
}

unsafe extern "C" fn cl_refuse_sampler(ctx: Handle, _a: Uint, _b: Uint, _c: Uint, errcode: *mut Int) -> Handle {
    error::create(errcode, || {
        obj::<Context>(ctx, cl::INVALID_CONTEXT)?;
        Err(cl::INVALID_OPERATION)
    })
}

/// Image commands: no image can exist, so the image argument is never a valid one.
unsafe extern "C" fn cl_refuse_image_op(q: Handle) -> Int {
    status(|| {
        obj::<Queue>(q, cl::INVALID_COMMAND_QUEUE)?;
        Err(cl::INVALID_MEM_OBJECT)
    })
}

/// `clSetCommandQueueProperty` (OpenCL 1.0, deprecated): queue properties are fixed at
/// creation here.
unsafe extern "C" fn cl_refuse_queue_op(q: Handle) -> Int {
    status(|| {
        obj::<Queue>(q, cl::INVALID_COMMAND_QUEUE)?;
        Err(cl::INVALID_OPERATION)
    })
}

unsafe extern "C" fn cl_refuse_mem_op(mem: Handle) -> Int {
    status(|| {
        obj::<Mem>(mem, cl::INVALID_MEM_OBJECT)?;
        Err(cl::INVALID_MEM_OBJECT) // no images exist
    })
}

unsafe extern "C" fn cl_refuse_sampler_op(_s: Handle) -> Int {
    cl::INVALID_SAMPLER
}

/// `clGetSuclServerStats` (a sucl extension, found through
/// `clGetExtensionFunctionAddressForPlatform`): the counters of the session on daemon
/// `server` (in `SUCL_REMOTE` order): commands executed, kernel launches, migrations into its
/// buffers over the peer link, bytes migrated in.
unsafe extern "C" fn cl_get_sucl_server_stats(platform: Handle, server: Uint, out: *mut u64) -> Int {
    status(|| {
        let p = the_platform(platform)?;
        if out.is_null() {
            return Err(cl::INVALID_VALUE);
        }
        let srv = p.servers.get(server as usize).ok_or(cl::INVALID_VALUE)?;
        let s = srv.remote.stats().map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
        for (i, v) in [s.executed, s.launches, s.migrations_network + s.migrations_peer_memory, s.migrated_bytes].into_iter().enumerate() {
            // SAFETY: the caller passes room for four counters.
            unsafe { *out.add(i) = v };
        }
        Ok(())
    })
}

unsafe extern "C" fn cl_get_extension_function_address(name: *const c_char) -> *mut c_void {
    error::guard(ptr::null_mut(), || {
        if name.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: a NUL-terminated function name.
        // The loader asks for clIcdGetPlatformIDsKHR and for core entry points it needs
        // before it has an object to dispatch through (ocl-icd asks for clGetPlatformInfo).
        match unsafe { CStr::from_ptr(name) }.to_str() {
            Ok("clIcdGetPlatformIDsKHR") => cl_icd_get_platform_ids_khr as *mut c_void,
            Ok("clGetSuclServerStats") => cl_get_sucl_server_stats as *mut c_void,
            Ok(n) => lookup(n).map_or(ptr::null_mut(), |f| f.cast_mut()),
            Err(_) => ptr::null_mut(),
        }
    })
}

unsafe extern "C" fn cl_get_extension_function_address_for_platform(_p: Handle, name: *const c_char) -> *mut c_void {
    // SAFETY: forwards the name.
    unsafe { cl_get_extension_function_address(name) }
}

/// The implementation of entry point `name`, if sucl has one (a refusal counts).
fn lookup(name: &str) -> Option<*const c_void> {
    macro_rules! f {
        ($f:expr) => {
            Some($f as *const c_void)
        };
    }
    match name {
        "clGetPlatformIDs" => f!(cl_icd_get_platform_ids_khr),
        "clGetPlatformInfo" => f!(cl_get_platform_info),
        "clGetDeviceIDs" => f!(cl_get_device_ids),
        "clGetDeviceInfo" => f!(cl_get_device_info),
        "clRetainDevice" | "clReleaseDevice" => f!(cl_retain_device),
        "clCreateSubDevices" => f!(cl_create_sub_devices),
        "clCreateContext" => f!(cl_create_context),
        "clCreateContextFromType" => f!(cl_create_context_from_type),
        "clRetainContext" => f!(cl_retain_context),
        "clReleaseContext" => f!(cl_release_context),
        "clGetContextInfo" => f!(cl_get_context_info),
        "clCreateCommandQueue" => f!(cl_create_command_queue),
        "clCreateCommandQueueWithProperties" => f!(cl_create_command_queue_with_properties),
        "clRetainCommandQueue" => f!(cl_retain_command_queue),
        "clReleaseCommandQueue" => f!(cl_release_command_queue),
        "clGetCommandQueueInfo" => f!(cl_get_command_queue_info),
        "clFlush" => f!(cl_flush),
        "clFinish" => f!(cl_finish),
        "clCreateBuffer" => f!(cl_create_buffer),
        "clCreateSubBuffer" => f!(cl_create_sub_buffer),
        "clRetainMemObject" => f!(cl_retain_mem_object),
        "clReleaseMemObject" => f!(cl_release_mem_object),
        "clGetMemObjectInfo" => f!(cl_get_mem_object_info),
        "clSetMemObjectDestructorCallback" => f!(cl_set_mem_object_destructor_callback),
        "clGetSupportedImageFormats" => f!(cl_get_supported_image_formats),
        "clCreateImage" | "clCreateImage2D" | "clCreateImage3D" => f!(cl_refuse_image),
        "clGetImageInfo" => f!(cl_refuse_mem_op),
        "clCreateSampler" => f!(cl_refuse_sampler),
        "clRetainSampler" | "clReleaseSampler" | "clGetSamplerInfo" => f!(cl_refuse_sampler_op),
        "clEnqueueReadImage"
        | "clEnqueueWriteImage"
        | "clEnqueueCopyImage"
        | "clEnqueueCopyImageToBuffer"
        | "clEnqueueCopyBufferToImage"
        | "clEnqueueMapImage"
        | "clEnqueueFillImage" => f!(cl_refuse_image_op),
        "clSetCommandQueueProperty" => f!(cl_refuse_queue_op),
        "clCreateProgramWithSource" => f!(cl_create_program_with_source),
        "clCreateProgramWithBinary" => f!(cl_create_program_with_binary),
        "clCreateProgramWithBuiltInKernels" => f!(cl_create_program_with_built_in_kernels),
        "clRetainProgram" => f!(cl_retain_program),
        "clReleaseProgram" => f!(cl_release_program),
        "clBuildProgram" => f!(cl_build_program),
        "clCompileProgram" => f!(cl_compile_program),
        "clLinkProgram" => f!(cl_link_program),
        "clUnloadCompiler" => f!(cl_unload_compiler),
        "clUnloadPlatformCompiler" => f!(cl_unload_platform_compiler),
        "clGetProgramInfo" => f!(cl_get_program_info),
        "clGetProgramBuildInfo" => f!(cl_get_program_build_info),
        "clCreateKernel" => f!(cl_create_kernel),
        "clCreateKernelsInProgram" => f!(cl_create_kernels_in_program),
        "clRetainKernel" => f!(cl_retain_kernel),
        "clReleaseKernel" => f!(cl_release_kernel),
        "clSetKernelArg" => f!(cl_set_kernel_arg),
        "clGetKernelInfo" => f!(cl_get_kernel_info),
        "clGetKernelWorkGroupInfo" => f!(cl_get_kernel_work_group_info),
        "clGetKernelArgInfo" => f!(cl_get_kernel_arg_info),
        "clWaitForEvents" => f!(cl_wait_for_events),
        "clGetEventInfo" => f!(cl_get_event_info),
        "clCreateUserEvent" => f!(cl_create_user_event),
        "clRetainEvent" => f!(cl_retain_event),
        "clReleaseEvent" => f!(cl_release_event),
        "clSetUserEventStatus" => f!(cl_set_user_event_status),
        "clSetEventCallback" => f!(cl_set_event_callback),
        "clGetEventProfilingInfo" => f!(cl_get_event_profiling_info),
        "clEnqueueReadBuffer" => f!(cl_enqueue_read_buffer),
        "clEnqueueWriteBuffer" => f!(cl_enqueue_write_buffer),
        "clEnqueueCopyBuffer" => f!(cl_enqueue_copy_buffer),
        "clEnqueueFillBuffer" => f!(cl_enqueue_fill_buffer),
        "clEnqueueReadBufferRect" => f!(cl_enqueue_read_buffer_rect),
        "clEnqueueWriteBufferRect" => f!(cl_enqueue_write_buffer_rect),
        "clEnqueueCopyBufferRect" => f!(cl_enqueue_copy_buffer_rect),
        "clEnqueueMapBuffer" => f!(cl_enqueue_map_buffer),
        "clEnqueueUnmapMemObject" => f!(cl_enqueue_unmap_mem_object),
        "clEnqueueMigrateMemObjects" => f!(cl_enqueue_migrate_mem_objects),
        "clEnqueueNDRangeKernel" => f!(cl_enqueue_nd_range_kernel),
        "clEnqueueTask" => f!(cl_enqueue_task),
        "clEnqueueNativeKernel" => f!(cl_enqueue_native_kernel),
        "clEnqueueMarker" => f!(cl_enqueue_marker),
        "clEnqueueBarrier" => f!(cl_enqueue_barrier),
        "clEnqueueWaitForEvents" => f!(cl_enqueue_wait_for_events),
        "clEnqueueMarkerWithWaitList" => f!(cl_enqueue_marker_with_wait_list),
        "clEnqueueBarrierWithWaitList" => f!(cl_enqueue_barrier_with_wait_list),
        "clGetExtensionFunctionAddress" => f!(cl_get_extension_function_address),
        "clGetExtensionFunctionAddressForPlatform" => f!(cl_get_extension_function_address_for_platform),
        _ => None,
    }
}

/// The loader's first call: the platforms of this library.
///
/// # Safety
/// The OpenCL contract: `platforms` has room for `n` handles, or is null with `num` non-null.
#[no_mangle]
pub unsafe extern "C" fn clIcdGetPlatformIDsKHR(n: Uint, platforms: *mut Handle, num: *mut Uint) -> Int {
    // SAFETY: forwards the loader's arguments.
    unsafe { cl_icd_get_platform_ids_khr(n, platforms, num) }
}

/// How the loader finds `clIcdGetPlatformIDsKHR` (and the core entry points it calls before
/// it has an object; everything else goes through the dispatch table).
///
/// # Safety
/// `name` is a NUL-terminated string or null.
#[no_mangle]
pub unsafe extern "C" fn clGetExtensionFunctionAddress(name: *const c_char) -> *mut c_void {
    // SAFETY: forwards the loader's argument.
    unsafe { cl_get_extension_function_address(name) }
}

/// The platform's variant of [`clGetExtensionFunctionAddress`].
///
/// # Safety
/// `name` is a NUL-terminated string or null.
#[no_mangle]
pub unsafe extern "C" fn clGetExtensionFunctionAddressForPlatform(platform: Handle, name: *const c_char) -> *mut c_void {
    // SAFETY: forwards the loader's arguments.
    unsafe { cl_get_extension_function_address_for_platform(platform, name) }
}

/// The device handles of the platform (used by the tests of this crate).
#[allow(dead_code)]
pub(crate) fn device_handles() -> Vec<Handle> {
    platform::get().map(|p| p.devices.iter().map(|d| d.handle()).collect()).unwrap_or_default()
}

#[allow(dead_code)]
fn _types(_: PlatformData) {}
