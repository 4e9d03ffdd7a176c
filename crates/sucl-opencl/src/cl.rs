//! The OpenCL types and constants this library uses (values from the Khronos `CL/cl.h`).

#![allow(missing_docs, dead_code)]

use std::ffi::c_void;

pub type Int = i32;
pub type Uint = u32;
pub type Handle = *mut c_void;

// Error codes.
pub const SUCCESS: Int = 0;
pub const DEVICE_NOT_FOUND: Int = -1;
pub const MEM_OBJECT_ALLOCATION_FAILURE: Int = -4;
pub const OUT_OF_RESOURCES: Int = -5;
pub const OUT_OF_HOST_MEMORY: Int = -6;
pub const PROFILING_INFO_NOT_AVAILABLE: Int = -7;
pub const MEM_COPY_OVERLAP: Int = -8;
pub const BUILD_PROGRAM_FAILURE: Int = -11;
pub const COMPILE_PROGRAM_FAILURE: Int = -15;
pub const LINK_PROGRAM_FAILURE: Int = -17;
pub const MAP_FAILURE: Int = -12;
pub const MISALIGNED_SUB_BUFFER_OFFSET: Int = -13;
pub const EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST: Int = -14;
pub const INVALID_VALUE: Int = -30;
pub const INVALID_DEVICE_TYPE: Int = -31;
pub const INVALID_PLATFORM: Int = -32;
pub const INVALID_DEVICE: Int = -33;
pub const INVALID_CONTEXT: Int = -34;
pub const INVALID_QUEUE_PROPERTIES: Int = -35;
pub const INVALID_COMMAND_QUEUE: Int = -36;
pub const INVALID_HOST_PTR: Int = -37;
pub const INVALID_MEM_OBJECT: Int = -38;
pub const INVALID_IMAGE_FORMAT_DESCRIPTOR: Int = -39;
pub const INVALID_IMAGE_SIZE: Int = -40;
pub const INVALID_SAMPLER: Int = -41;
pub const INVALID_BINARY: Int = -42;
pub const INVALID_BUILD_OPTIONS: Int = -43;
pub const INVALID_PROGRAM: Int = -44;
pub const INVALID_PROGRAM_EXECUTABLE: Int = -45;
pub const INVALID_KERNEL_NAME: Int = -46;
pub const INVALID_KERNEL_DEFINITION: Int = -47;
pub const INVALID_KERNEL: Int = -48;
pub const INVALID_ARG_INDEX: Int = -49;
pub const INVALID_ARG_VALUE: Int = -50;
pub const INVALID_ARG_SIZE: Int = -51;
pub const INVALID_KERNEL_ARGS: Int = -52;
pub const INVALID_WORK_DIMENSION: Int = -53;
pub const INVALID_WORK_GROUP_SIZE: Int = -54;
pub const INVALID_WORK_ITEM_SIZE: Int = -55;
pub const INVALID_GLOBAL_OFFSET: Int = -56;
pub const INVALID_EVENT_WAIT_LIST: Int = -57;
pub const INVALID_EVENT: Int = -58;
pub const INVALID_OPERATION: Int = -59;
pub const INVALID_BUFFER_SIZE: Int = -61;
pub const INVALID_GLOBAL_WORK_SIZE: Int = -63;
pub const INVALID_PROPERTY: Int = -64;
pub const INVALID_COMPILER_OPTIONS: Int = -66;
pub const INVALID_LINKER_OPTIONS: Int = -67;
pub const INVALID_DEVICE_PARTITION_COUNT: Int = -68;
pub const PLATFORM_NOT_FOUND_KHR: Int = -1001;

// Platform info.
pub const PLATFORM_PROFILE: Uint = 0x0900;
pub const PLATFORM_VERSION: Uint = 0x0901;
pub const PLATFORM_NAME: Uint = 0x0902;
pub const PLATFORM_VENDOR: Uint = 0x0903;
pub const PLATFORM_EXTENSIONS: Uint = 0x0904;
pub const PLATFORM_HOST_TIMER_RESOLUTION: Uint = 0x0905;
pub const PLATFORM_NUMERIC_VERSION: Uint = 0x0906;
pub const PLATFORM_EXTENSIONS_WITH_VERSION: Uint = 0x0907;
pub const PLATFORM_ICD_SUFFIX_KHR: Uint = 0x0920;

// Device types.
pub const DEVICE_TYPE_DEFAULT: u64 = 1;
pub const DEVICE_TYPE_CPU: u64 = 2;
pub const DEVICE_TYPE_GPU: u64 = 4;
pub const DEVICE_TYPE_ACCELERATOR: u64 = 8;
pub const DEVICE_TYPE_CUSTOM: u64 = 16;
pub const DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;

// Device info.
pub const DEVICE_TYPE: Uint = 0x1000;
pub const DEVICE_MAX_WORK_ITEM_SIZES: Uint = 0x1005;
pub const DEVICE_MAX_WORK_GROUP_SIZE: Uint = 0x1004;
pub const DEVICE_IMAGE_SUPPORT: Uint = 0x1016;
pub const DEVICE_MEM_BASE_ADDR_ALIGN: Uint = 0x1019;
pub const DEVICE_GLOBAL_MEM_SIZE: Uint = 0x101F;
pub const DEVICE_MAX_MEM_ALLOC_SIZE: Uint = 0x1010;
pub const DEVICE_HOST_UNIFIED_MEMORY: Uint = 0x1035;
pub const DEVICE_EXECUTION_CAPABILITIES: Uint = 0x1029;
pub const DEVICE_QUEUE_PROPERTIES: Uint = 0x102A;
pub const DEVICE_NAME: Uint = 0x102B;
pub const DEVICE_VERSION: Uint = 0x102F;
pub const DEVICE_EXTENSIONS: Uint = 0x1030;
pub const DEVICE_PLATFORM: Uint = 0x1031;
pub const DEVICE_OPENCL_C_VERSION: Uint = 0x103D;
pub const DEVICE_PARENT_DEVICE: Uint = 0x1042;
pub const DEVICE_PARTITION_MAX_SUB_DEVICES: Uint = 0x1043;
pub const DEVICE_PARTITION_PROPERTIES: Uint = 0x1044;
pub const DEVICE_PARTITION_AFFINITY_DOMAIN: Uint = 0x1045;
pub const DEVICE_PARTITION_TYPE: Uint = 0x1046;
pub const DEVICE_REFERENCE_COUNT: Uint = 0x1047;
pub const DEVICE_BUILT_IN_KERNELS: Uint = 0x103F;
pub const DEVICE_IMAGE_MAX_BUFFER_SIZE: Uint = 0x1040;
pub const DEVICE_IMAGE_MAX_ARRAY_SIZE: Uint = 0x1041;
pub const DEVICE_MAX_READ_IMAGE_ARGS: Uint = 0x100E;
pub const DEVICE_MAX_WRITE_IMAGE_ARGS: Uint = 0x100F;
pub const DEVICE_IMAGE2D_MAX_WIDTH: Uint = 0x1011;
pub const DEVICE_IMAGE2D_MAX_HEIGHT: Uint = 0x1012;
pub const DEVICE_IMAGE3D_MAX_WIDTH: Uint = 0x1013;
pub const DEVICE_IMAGE3D_MAX_HEIGHT: Uint = 0x1014;
pub const DEVICE_IMAGE3D_MAX_DEPTH: Uint = 0x1015;
pub const DEVICE_MAX_SAMPLERS: Uint = 0x1018;
pub const DEVICE_IMAGE_PITCH_ALIGNMENT: Uint = 0x104A;
pub const DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT: Uint = 0x104B;
pub const DEVICE_MAX_READ_WRITE_IMAGE_ARGS: Uint = 0x104C;
pub const DEVICE_SVM_CAPABILITIES: Uint = 0x1053;
pub const DEVICE_MAX_PIPE_ARGS: Uint = 0x1055;
pub const DEVICE_PIPE_MAX_ACTIVE_RESERVATIONS: Uint = 0x1056;
pub const DEVICE_PIPE_MAX_PACKET_SIZE: Uint = 0x1057;
pub const DEVICE_QUEUE_ON_HOST_PROPERTIES: Uint = 0x102A;
pub const DEVICE_QUEUE_ON_DEVICE_PROPERTIES: Uint = 0x104E;
pub const DEVICE_MAX_ON_DEVICE_QUEUES: Uint = 0x1051;
pub const DEVICE_MAX_ON_DEVICE_EVENTS: Uint = 0x1052;
pub const DEVICE_IL_VERSION: Uint = 0x105B;
pub const DEVICE_MAX_NUM_SUB_GROUPS: Uint = 0x105C;
pub const DEVICE_NUMERIC_VERSION: Uint = 0x105E;
pub const DEVICE_EXTENSIONS_WITH_VERSION: Uint = 0x1060;
pub const DEVICE_ILS_WITH_VERSION: Uint = 0x1061;
pub const DEVICE_BUILT_IN_KERNELS_WITH_VERSION: Uint = 0x1062;
pub const DEVICE_ATOMIC_MEMORY_CAPABILITIES: Uint = 0x1063;
pub const DEVICE_ATOMIC_FENCE_CAPABILITIES: Uint = 0x1064;
pub const DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT: Uint = 0x1065;
pub const DEVICE_OPENCL_C_ALL_VERSIONS: Uint = 0x1066;
pub const DEVICE_WORK_GROUP_COLLECTIVE_FUNCTIONS_SUPPORT: Uint = 0x1068;
pub const DEVICE_GENERIC_ADDRESS_SPACE_SUPPORT: Uint = 0x1069;
pub const DEVICE_OPENCL_C_FEATURES: Uint = 0x106F;
pub const DEVICE_DEVICE_ENQUEUE_CAPABILITIES: Uint = 0x1070;
pub const DEVICE_PIPE_SUPPORT: Uint = 0x1071;
pub const DEVICE_LATEST_CONFORMANCE_VERSION_PASSED: Uint = 0x1072;

// Context info and properties.
pub const CONTEXT_REFERENCE_COUNT: Uint = 0x1080;
pub const CONTEXT_DEVICES: Uint = 0x1081;
pub const CONTEXT_PROPERTIES: Uint = 0x1082;
pub const CONTEXT_NUM_DEVICES: Uint = 0x1083;
pub const CONTEXT_PLATFORM: isize = 0x1084;
pub const CONTEXT_INTEROP_USER_SYNC: isize = 0x1085;

// Queues.
pub const QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE: u64 = 1;
pub const QUEUE_PROFILING_ENABLE: u64 = 2;
/// `CL_EXEC_KERNEL`: the device runs OpenCL kernels (`CL_DEVICE_EXECUTION_CAPABILITIES`).
pub const EXEC_KERNEL: u64 = 1;
pub const QUEUE_CONTEXT: Uint = 0x1090;
pub const QUEUE_DEVICE: Uint = 0x1091;
pub const QUEUE_REFERENCE_COUNT: Uint = 0x1092;
pub const QUEUE_PROPERTIES: Uint = 0x1093;
pub const QUEUE_SIZE: Uint = 0x1094;
pub const QUEUE_DEVICE_DEFAULT: Uint = 0x1095;
pub const QUEUE_PROPERTIES_ARRAY: Uint = 0x1098;

// Memory.
pub const MEM_READ_WRITE: u64 = 1;
pub const MEM_WRITE_ONLY: u64 = 2;
pub const MEM_READ_ONLY: u64 = 4;
pub const MEM_USE_HOST_PTR: u64 = 8;
pub const MEM_ALLOC_HOST_PTR: u64 = 16;
pub const MEM_COPY_HOST_PTR: u64 = 32;
pub const MEM_HOST_WRITE_ONLY: u64 = 1 << 7;
pub const MEM_HOST_READ_ONLY: u64 = 1 << 8;
pub const MEM_HOST_NO_ACCESS: u64 = 1 << 9;
pub const MEM_OBJECT_BUFFER: Uint = 0x10F0;
pub const MEM_TYPE: Uint = 0x1100;
pub const MEM_FLAGS: Uint = 0x1101;
pub const MEM_SIZE: Uint = 0x1102;
pub const MEM_HOST_PTR: Uint = 0x1103;
pub const MEM_MAP_COUNT: Uint = 0x1104;
pub const MEM_REFERENCE_COUNT: Uint = 0x1105;
pub const MEM_CONTEXT: Uint = 0x1106;
pub const MEM_ASSOCIATED_MEMOBJECT: Uint = 0x1107;
pub const MEM_OFFSET: Uint = 0x1108;
pub const MEM_USES_SVM_POINTER: Uint = 0x1109;
pub const MEM_PROPERTIES: Uint = 0x110A;
pub const BUFFER_CREATE_TYPE_REGION: Uint = 0x1220;
pub const MAP_READ: u64 = 1;
pub const MAP_WRITE: u64 = 2;
pub const MAP_WRITE_INVALIDATE_REGION: u64 = 4;

// Programs.
pub const PROGRAM_REFERENCE_COUNT: Uint = 0x1160;
pub const PROGRAM_CONTEXT: Uint = 0x1161;
pub const PROGRAM_NUM_DEVICES: Uint = 0x1162;
pub const PROGRAM_DEVICES: Uint = 0x1163;
pub const PROGRAM_SOURCE: Uint = 0x1164;
pub const PROGRAM_BINARY_SIZES: Uint = 0x1165;
pub const PROGRAM_BINARIES: Uint = 0x1166;
pub const PROGRAM_NUM_KERNELS: Uint = 0x1167;
pub const PROGRAM_KERNEL_NAMES: Uint = 0x1168;
pub const PROGRAM_IL: Uint = 0x1169;
pub const PROGRAM_SCOPE_GLOBAL_CTORS_PRESENT: Uint = 0x116A;
pub const PROGRAM_SCOPE_GLOBAL_DTORS_PRESENT: Uint = 0x116B;
pub const PROGRAM_BUILD_STATUS: Uint = 0x1181;
pub const PROGRAM_BUILD_OPTIONS: Uint = 0x1182;
pub const PROGRAM_BUILD_LOG: Uint = 0x1183;
pub const PROGRAM_BINARY_TYPE: Uint = 0x1184;
pub const PROGRAM_BUILD_GLOBAL_VARIABLE_TOTAL_SIZE: Uint = 0x1185;
pub const BUILD_SUCCESS: Int = 0;
pub const BUILD_NONE: Int = -1;
pub const BUILD_ERROR: Int = -2;
pub const PROGRAM_BINARY_TYPE_NONE: Uint = 0;
pub const PROGRAM_BINARY_TYPE_COMPILED_OBJECT: Uint = 1;
pub const PROGRAM_BINARY_TYPE_LIBRARY: Uint = 2;
pub const PROGRAM_BINARY_TYPE_EXECUTABLE: Uint = 4;

// Kernels.
pub const KERNEL_FUNCTION_NAME: Uint = 0x1190;
pub const KERNEL_NUM_ARGS: Uint = 0x1191;
pub const KERNEL_REFERENCE_COUNT: Uint = 0x1192;
pub const KERNEL_CONTEXT: Uint = 0x1193;
pub const KERNEL_PROGRAM: Uint = 0x1194;
pub const KERNEL_ATTRIBUTES: Uint = 0x1195;
pub const KERNEL_ARG_ADDRESS_GLOBAL: Uint = 0x119B;
pub const KERNEL_ARG_ADDRESS_LOCAL: Uint = 0x119C;
pub const KERNEL_ARG_ADDRESS_CONSTANT: Uint = 0x119D;
pub const KERNEL_ARG_ADDRESS_PRIVATE: Uint = 0x119E;
pub const KERNEL_ARG_TYPE_NAME: Uint = 0x1198;
pub const KERNEL_GLOBAL_WORK_SIZE: Uint = 0x11B5;

// Events.
pub const EVENT_COMMAND_QUEUE: Uint = 0x11D0;
pub const EVENT_COMMAND_TYPE: Uint = 0x11D1;
pub const EVENT_REFERENCE_COUNT: Uint = 0x11D2;
pub const EVENT_COMMAND_EXECUTION_STATUS: Uint = 0x11D3;
pub const EVENT_CONTEXT: Uint = 0x11D4;
pub const COMPLETE: Int = 0;
pub const RUNNING: Int = 1;
pub const SUBMITTED: Int = 2;
pub const QUEUED: Int = 3;
pub const COMMAND_NDRANGE_KERNEL: Uint = 0x11F0;
pub const COMMAND_TASK: Uint = 0x11F1;
pub const COMMAND_READ_BUFFER: Uint = 0x11F3;
pub const COMMAND_WRITE_BUFFER: Uint = 0x11F4;
pub const COMMAND_COPY_BUFFER: Uint = 0x11F5;
pub const COMMAND_MAP_BUFFER: Uint = 0x11FB;
pub const COMMAND_UNMAP_MEM_OBJECT: Uint = 0x11FD;
pub const COMMAND_MARKER: Uint = 0x11FE;
pub const COMMAND_READ_BUFFER_RECT: Uint = 0x1201;
pub const COMMAND_WRITE_BUFFER_RECT: Uint = 0x1202;
pub const COMMAND_COPY_BUFFER_RECT: Uint = 0x1203;
pub const COMMAND_USER: Uint = 0x1204;
pub const COMMAND_BARRIER: Uint = 0x1205;
pub const COMMAND_MIGRATE_MEM_OBJECTS: Uint = 0x1206;
pub const COMMAND_FILL_BUFFER: Uint = 0x1207;
pub const PROFILING_COMMAND_QUEUED: Uint = 0x1280;
pub const PROFILING_COMMAND_SUBMIT: Uint = 0x1281;
pub const PROFILING_COMMAND_START: Uint = 0x1282;
pub const PROFILING_COMMAND_END: Uint = 0x1283;
pub const PROFILING_COMMAND_COMPLETE: Uint = 0x1284;

pub const MIGRATE_MEM_OBJECT_HOST: u64 = 1;
pub const MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED: u64 = 2;

/// A `cl_buffer_region`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BufferRegion {
    pub origin: usize,
    pub size: usize,
}

/// An event callback: `void (*)(cl_event, cl_int, void *)`.
pub type EventCallback = unsafe extern "C" fn(Handle, Int, *mut c_void);
/// A context error callback.
pub type ContextCallback = unsafe extern "C" fn(*const std::ffi::c_char, *const c_void, usize, *mut c_void);
/// A build callback.
pub type ProgramCallback = unsafe extern "C" fn(Handle, *mut c_void);
/// A memory destructor callback.
pub type MemCallback = unsafe extern "C" fn(Handle, *mut c_void);
