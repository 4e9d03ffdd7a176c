//! The wire protocol between clients and `sucld`.
//!
//! Every message is one *frame*: a little-endian `u32` body length, then the body. A body starts
//! with a one-byte frame tag; every field after it is little-endian and fixed-size, except byte
//! strings and lists, which carry a `u32` count first. A frame's length is checked against the
//! limit in force (a small fixed one during the handshake, the negotiated one after it) before a
//! byte of its body is allocated, and every count inside a body is checked against the bytes
//! that remain (and against its own limit) before anything is allocated for it. A body must be
//! consumed exactly: trailing bytes are an error.
//!
//! A connection opens with [`Frame::Hello`] (client: magic, version range, features, largest
//! frame it accepts, a fresh nonce) and [`Frame::Welcome`] (server: the chosen version, the
//! common features, the smaller frame limit, its own nonce). The client then either opens a new
//! session ([`Frame::Open`]) or re-attaches to one ([`Frame::Attach`]; on a TLS link of a
//! session with [`feature::CHANNEL_BOUND_ATTACH`], sent right behind the hello, with the
//! commands to re-send behind it); see [`crate::auth`].
//! After that the client sends [`Frame::Command`]s, each with a sequence number, and the server
//! answers each with a [`Frame::Reply`] carrying the same number.

use std::io::{self, Read, Write};

/// `b"SUCL"` read as a little-endian `u32`: the first field of every [`Frame::Hello`].
pub const MAGIC: u32 = u32::from_le_bytes(*b"SUCL");
/// The protocol version this build speaks (it speaks exactly one). Version 2 added the
/// peer-memory migration frames ([`Frame::PeerMemOffer`] and its answers) and the migration
/// counters of [`SessionStats`]; version 3 added OpenCL devices ([`DeviceKind::OpenCl`]) and
/// their commands ([`Command::ClBuild`], [`Command::ClCompile`], [`Command::ClLink`],
/// [`Command::ClKernel`], [`Command::ClLaunch`],
/// [`Command::ClQuery`], [`Command::ClRelease`]), the read-only flags in the answer to
/// [`Command::ClKernel`], and [`Command::ReleaseEvents`] (a version-3 client records each event
/// id once).
pub const VERSION: u16 = 3;
/// The most events one [`Command::ReleaseEvents`] releases.
pub const MAX_RELEASES: usize = 4096;
/// The largest frame either side accepts before the handshake has negotiated a limit.
pub const HANDSHAKE_MAX_FRAME: u32 = 1024;
/// The smallest frame limit a peer may ask for (every fixed-size command must fit).
pub const MIN_MAX_FRAME: u32 = 4096;
/// The frame limit this build asks for by default (16 MiB).
pub const DEFAULT_MAX_FRAME: u32 = 16 << 20;
/// The longest kernel or device name on the wire.
pub const MAX_NAME: usize = 256;
/// The most arguments one kernel launch carries. A daemon reports OpenCL devices'
/// `CL_DEVICE_MAX_PARAMETER_SIZE` as at most this many bytes, so every kernel whose
/// arguments fit has no more arguments than this (NVIDIA's GPUs offer 32764 bytes).
pub const MAX_ARGS: usize = 4096;
/// The longest fill pattern.
pub const MAX_PATTERN: usize = 64;
/// The most devices one server lists.
pub const MAX_DEVICES: usize = 256;
/// The longest by-value OpenCL kernel argument (a struct or vector passed by value).
pub const MAX_ARG_BYTES: usize = 1024;
/// The longest OpenCL build option string.
pub const MAX_OPTIONS: usize = 4096;
/// The most headers one [`Command::ClCompile`] carries, and the most programs one
/// [`Command::ClLink`] links.
pub const MAX_PROGRAM_INPUTS: usize = 4096;
/// The longest OpenCL kernel name ([`Command::ClKernel`]; OpenCL sets no limit, and the
/// conformance tests use names of 2048 characters).
pub const MAX_CL_KERNEL_NAME: usize = 4096;
/// The bytes a [`Frame::Command`] carrying a write needs besides its data (tags, sequence
/// numbers, ids, offsets and the data's count), so that a client can split large writes.
pub const WRITE_OVERHEAD: usize = 1 + 8 + 8 + 1 + 8 + 8 + 4;
/// The bytes a [`Frame::Reply`] carrying read data needs besides the data.
pub const READ_REPLY_OVERHEAD: usize = 1 + 8 + 1 + 4;

/// Feature bits negotiated in the handshake (the intersection of both sides' sets is in force).
pub mod feature {
    /// Named host kernels from the daemon's registry.
    pub const HOST_KERNELS: u64 = 1;
    /// CUDA C kernels compiled by NVRTC on the server.
    pub const CUDA_KERNELS: u64 = 2;
    /// Peer meshes: server-to-server migration and completion notices.
    pub const MESH: u64 = 4;
    /// Content-size buffers.
    pub const CONTENT_SIZE: u64 = 8;
    /// On TLS links, a re-attach's proofs are bound to the TLS channel (an exporter value)
    /// instead of the server's nonce, so the client sends [`super::Frame::Attach`] — and the
    /// commands it re-sends — right after its [`super::Frame::Hello`], without waiting for the
    /// [`super::Frame::Welcome`] (see [`crate::auth`]). In force for a session when it was
    /// negotiated at [`super::Frame::Open`]; plain TCP links always use the nonces.
    pub const CHANNEL_BOUND_ATTACH: u64 = 16;
    /// OpenCL devices: programs built from OpenCL C source on the server, NDRange launches.
    pub const OPENCL: u64 = 32;
    /// Every feature this build knows.
    pub const ALL: u64 = HOST_KERNELS | CUDA_KERNELS | MESH | CONTENT_SIZE | CHANNEL_BOUND_ATTACH | OPENCL;
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The body ended inside a field.
    #[error("truncated frame: {what} needs {need} more bytes, {left} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs.
        need: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// A length or count over its limit.
    #[error("{what} of {len} exceeds the limit of {limit}")]
    TooLong {
        /// What was counted.
        what: &'static str,
        /// The length the peer claimed.
        len: u64,
        /// The limit in force.
        limit: u64,
    },
    /// An unknown tag.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// Which kind of tag.
        what: &'static str,
        /// The tag's value.
        tag: u8,
    },
    /// Bytes after the last field.
    #[error("{0} trailing bytes after the frame's last field")]
    Trailing(usize),
    /// A string that is not UTF-8.
    #[error("{0} is not valid UTF-8")]
    BadUtf8(&'static str),
    /// The first field of a hello is not [`MAGIC`].
    #[error("bad magic {0:#010x}: not a sucl remote peer")]
    BadMagic(u32),
    /// An empty frame.
    #[error("empty frame")]
    Empty,
}

/// A kernel argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A buffer of the session, by id.
    Buffer(u64),
    /// An unsigned integer.
    U64(u64),
    /// A signed integer.
    I64(i64),
    /// A double.
    F64(f64),
    /// A float.
    F32(f32),
}

/// One device a server offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// What kind of device it is.
    pub kind: DeviceKind,
    /// Its name.
    pub name: String,
    /// Its memory in bytes.
    pub memory: u64,
}

/// The kinds of device a server can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// Host memory and host kernels from the daemon's registry.
    Host,
    /// A CUDA GPU (kernels compiled by NVRTC on the server).
    Cuda,
    /// A device of an OpenCL platform the server loaded (programs built from OpenCL C on the
    /// server).
    OpenCl,
}

/// One argument of an OpenCL kernel launch ([`Command::ClLaunch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClArg {
    /// Bytes `offset..offset + len` of a buffer of the session (`len` 0: the whole buffer,
    /// from `offset` 0); a part becomes a sub-buffer for the launch.
    Mem {
        /// The buffer.
        buffer: u64,
        /// Byte offset of the part.
        offset: u64,
        /// Bytes of the part (0: the whole buffer).
        len: u64,
    },
    /// A null buffer.
    NullMem,
    /// A value, as its bytes (at most [`MAX_ARG_BYTES`]).
    Value(Vec<u8>),
    /// A `__local` argument of this many bytes.
    Local(u64),
}

/// What a [`Command::ClQuery`] asks: which OpenCL info call, on which object.
pub mod cl_query {
    /// `clGetDeviceInfo(device, param)`.
    pub const DEVICE: u8 = 0;
    /// `clGetKernelInfo(kernel, param)`.
    pub const KERNEL: u8 = 1;
    /// `clGetKernelWorkGroupInfo(kernel, device, param)`.
    pub const KERNEL_WORK_GROUP: u8 = 2;
    /// `clGetProgramBuildInfo(program, device, param)`.
    pub const PROGRAM_BUILD: u8 = 3;
    /// The four profiling times (queued, submitted, started, ended; `u64` ns each) of the
    /// last OpenCL command before event `object` on its queue; the parameter is unused.
    pub const EVENT_PROFILE: u8 = 4;
    /// `clGetKernelArgInfo(kernel, arg index = device, param)`.
    pub const KERNEL_ARG: u8 = 5;
    /// `clGetProgramInfo(program, param)` (kernel names and counts; not handles).
    pub const PROGRAM: u8 = 6;
    /// The largest `what` this build knows.
    pub const LAST: u8 = 6;
}

/// What a [`Command::ClRelease`] releases.
pub mod cl_object {
    /// A program ([`super::Command::ClBuild`]).
    pub const PROGRAM: u8 = 0;
    /// A kernel ([`super::Command::ClKernel`]).
    pub const KERNEL: u8 = 1;
}

/// What a session has done and holds, as the server counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionStats {
    /// Commands executed (each sequence number counts once, however often it was sent).
    pub executed: u64,
    /// Kernel launches executed.
    pub launches: u64,
    /// Device bytes the session's buffers hold.
    pub bytes_in_use: u64,
    /// Buffers the session holds.
    pub buffers: u32,
    /// Frames this session received over peer links (notices, subscriptions, data pieces).
    pub peer_frames: u64,
    /// Migrations into this session's buffers copied GPU to GPU through peer memory.
    pub migrations_peer_memory: u64,
    /// Migrations into this session's buffers whose bytes came over the peer link.
    pub migrations_network: u64,
    /// Bytes migrated into this session's buffers (either way).
    pub migrated_bytes: u64,
    /// Nanoseconds this session's commands spent waiting for peers (a migration's offer,
    /// bytes or confirmation; a remote event): the host side of notice latency.
    pub peer_wait_ns: u64,
}

/// A command from a client, executed in sequence-number order on the client's session.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Does nothing (answers [`Outcome::Done`]); a round-trip probe.
    Nop,
    /// Lists the server's devices ([`Outcome::Devices`]).
    Devices,
    /// Creates queue `queue` (an id the client chose) on device `device`.
    CreateQueue {
        /// The new queue's id.
        queue: u64,
        /// Index into the server's device list.
        device: u32,
    },
    /// Allocates `bytes` zeroed bytes on `device` as buffer `buffer` (an id the client chose).
    Alloc {
        /// The new buffer's id.
        buffer: u64,
        /// Index into the server's device list.
        device: u32,
        /// Size in bytes.
        bytes: u64,
    },
    /// Frees a buffer.
    Free {
        /// The buffer.
        buffer: u64,
    },
    /// Writes `data` into `buffer` at byte `offset`.
    Write {
        /// The buffer.
        buffer: u64,
        /// Byte offset.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Reads `len` bytes of `buffer` at `offset` ([`Outcome::Data`]).
    Read {
        /// The buffer.
        buffer: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes to read.
        len: u64,
    },
    /// Copies `len` bytes between (or within) buffers of one device.
    Copy {
        /// Source buffer.
        src: u64,
        /// Byte offset in the source.
        src_offset: u64,
        /// Destination buffer.
        dst: u64,
        /// Byte offset in the destination.
        dst_offset: u64,
        /// Bytes to copy.
        len: u64,
    },
    /// Fills `len` bytes at `offset` with `pattern` repeated (`len` a multiple of its length).
    Fill {
        /// The buffer.
        buffer: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes to fill.
        len: u64,
        /// The pattern (1 to [`MAX_PATTERN`] bytes).
        pattern: Vec<u8>,
    },
    /// Runs kernel `kernel` on `queue`.
    Launch {
        /// The queue.
        queue: u64,
        /// The kernel: a name in the daemon's registry (host) or one compiled with
        /// [`Command::CompileCuda`] (CUDA).
        kernel: String,
        /// Its arguments.
        args: Vec<Arg>,
        /// Work items (host kernels: elements to process, 0 = all; CUDA: the grid and block
        /// are derived from it).
        range: u64,
    },
    /// Compiles CUDA C `source` with NVRTC on `device` and registers function `name` from it.
    CompileCuda {
        /// The device.
        device: u32,
        /// The function to load.
        name: String,
        /// The CUDA C source.
        source: String,
    },
    /// Records event `event` (an id the client chose) at the current end of `queue`.
    Record {
        /// The queue.
        queue: u64,
        /// The new event's id.
        event: u64,
    },
    /// Makes later work on `queue` wait for `event`.
    WaitEvent {
        /// The queue.
        queue: u64,
        /// The event.
        event: u64,
    },
    /// Answers once `event` has completed.
    SyncEvent {
        /// The event.
        event: u64,
    },
    /// Answers once everything on `queue` has run.
    Finish {
        /// The queue.
        queue: u64,
    },
    /// The session's counters ([`Outcome::Stats`]).
    Stats,
    /// Makes this session a member of a peer mesh: `index` is this server's place in it,
    /// `peers` the other members, `key` the credential the client hands every member (peer
    /// links prove they hold it).
    JoinMesh {
        /// The mesh's id (the same on every member).
        mesh: [u8; 16],
        /// The credential peer links prove they hold.
        key: [u8; 32],
        /// This server's index in the mesh.
        index: u32,
        /// The other members.
        peers: Vec<PeerSpec>,
    },
    /// Sends `len` bytes of `buffer` at `offset` (fewer when its content size says so) to mesh
    /// member `peer` as transfer `transfer`, straight over the peer link.
    MigrateOut {
        /// The source buffer.
        buffer: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes at most.
        len: u64,
        /// The destination's mesh index.
        peer: u32,
        /// The transfer's id (chosen by the client; the destination names it too).
        transfer: u64,
    },
    /// Receives transfer `transfer` from mesh member `peer` into `buffer` at `offset` (at most
    /// `len` bytes); runs once the bytes have arrived. Sets the buffer's content size, if it
    /// has one, to the bytes received.
    MigrateIn {
        /// The destination buffer.
        buffer: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes at most.
        len: u64,
        /// The source's mesh index.
        peer: u32,
        /// The transfer's id.
        transfer: u64,
    },
    /// Holds back later commands until event `event` of mesh member `peer` has completed
    /// (the server learns it from that peer, not from the client). A client counts the waits it
    /// posts for each event, and tells the event's server when it releases the event
    /// ([`Command::ReleaseEvents`]).
    WaitRemote {
        /// The mesh index of the event's server.
        peer: u32,
        /// The event.
        event: u64,
    },
    /// Names `size_buffer` (0 = none) as the buffer holding how many bytes of `buffer` are
    /// meaningful (a little-endian u64); reads, copies and migrations move only those.
    SetContentSize {
        /// The buffer.
        buffer: u64,
        /// The size buffer (at least 8 bytes, same device), or 0 to clear it.
        size_buffer: u64,
    },
    /// Builds OpenCL C `source` with `options` for OpenCL device `device` as program `program`
    /// (an id the client chose). The program is kept even when its build fails (its log stays
    /// readable through [`Command::ClQuery`]); the failure is answered as
    /// [`code::opencl`]`(CL_BUILD_PROGRAM_FAILURE)` with the log as its message.
    ClBuild {
        /// The new program's id.
        program: u64,
        /// The device.
        device: u32,
        /// The OpenCL C source.
        source: String,
        /// The build options (at most [`MAX_OPTIONS`] bytes).
        options: String,
    },
    /// Compiles OpenCL C `source` with `options` for OpenCL device `device` into program
    /// `program` (an id the client chose), a compiled object for [`Command::ClLink`]
    /// (`clCompileProgram`); `headers` are the embedded headers, (include name, source).
    /// Kept and answered as [`Command::ClBuild`] is, failing with
    /// [`code::opencl`]`(CL_COMPILE_PROGRAM_FAILURE)` and the log.
    ClCompile {
        /// The new program's id.
        program: u64,
        /// The device.
        device: u32,
        /// The OpenCL C source.
        source: String,
        /// The compile options (at most [`MAX_OPTIONS`] bytes).
        options: String,
        /// The embedded headers (at most [`MAX_PROGRAM_INPUTS`]): include name, source.
        headers: Vec<(String, String)>,
    },
    /// Links the compiled objects and libraries `inputs` (programs of `device`) with
    /// `options` into program `program` (an id the client chose), an executable or, with
    /// `-create-library`, a library (`clLinkProgram`). A failed link that leaves a program
    /// keeps it (its log readable) and fails with [`code::opencl`]`(CL_LINK_PROGRAM_FAILURE)`.
    ClLink {
        /// The new program's id.
        program: u64,
        /// The device.
        device: u32,
        /// The link options (at most [`MAX_OPTIONS`] bytes).
        options: String,
        /// The programs linked (at most [`MAX_PROGRAM_INPUTS`]).
        inputs: Vec<u64>,
    },
    /// Creates kernel `kernel` (an id the client chose) from function `name` of built program
    /// `program`; answers [`Outcome::Data`]: its argument count (`u32`), then each argument's
    /// address qualifier (`u32`, `CL_KERNEL_ARG_ADDRESS_*`, 0 when the platform cannot say),
    /// then for each argument 1 if the kernel only reads it (`__constant`, or a pointer to
    /// `const`), else 0 (`u32` each).
    ClKernel {
        /// The new kernel's id.
        kernel: u64,
        /// The program.
        program: u64,
        /// The kernel function (at most [`MAX_CL_KERNEL_NAME`] bytes).
        name: String,
    },
    /// Runs OpenCL kernel `kernel` on `queue` over an NDRange of `dims` (1-3) dimensions.
    ClLaunch {
        /// The queue (on the kernel's device).
        queue: u64,
        /// The kernel.
        kernel: u64,
        /// Dimensions, 1 to 3.
        dims: u8,
        /// The global offset per dimension.
        offset: [u64; 3],
        /// The global size per dimension.
        global: [u64; 3],
        /// The local size per dimension (all 0: the platform chooses).
        local: [u64; 3],
        /// Every argument, in order.
        args: Vec<ClArg>,
    },
    /// Answers an OpenCL info query ([`cl_query`]) as the platform's bytes ([`Outcome::Data`]).
    ClQuery {
        /// One of [`cl_query`].
        what: u8,
        /// The kernel, program or event (unused for devices).
        object: u64,
        /// The device (for [`cl_query::KERNEL_ARG`]: the argument index).
        device: u32,
        /// The `cl_*_info` parameter.
        param: u32,
    },
    /// Releases a program or kernel ([`cl_object`]).
    ClRelease {
        /// One of [`cl_object`].
        what: u8,
        /// Its id.
        id: u64,
    },
    /// Releases events the client will name no more, each with how many
    /// [`Command::WaitRemote`]s for it the client posted to other members of its mesh (once
    /// those have asked for it, and it completed, the server forgets it). A client records
    /// each event id once. At most [`MAX_RELEASES`] events.
    ReleaseEvents {
        /// (event, waits posted for it).
        events: Vec<(u64, u64)>,
    },
}

/// One member of a peer mesh, as a client describes it to the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    /// Its index in the mesh.
    pub index: u32,
    /// Where the other members reach it (`host:port`).
    pub address: String,
    /// The SHA-256 of its TLS certificate (all zero: the link is plain TCP).
    pub pin: [u8; 32],
}

/// The most members a mesh may have.
pub const MAX_PEERS: usize = 64;

/// Error codes of [`Outcome::Failed`].
pub mod code {
    /// An id, offset, size or argument that is not valid.
    pub const INVALID: u16 = 1;
    /// A per-session limit would be exceeded.
    pub const LIMIT: u16 = 2;
    /// The device failed.
    pub const DEVICE: u16 = 3;
    /// A kernel failed or does not exist.
    pub const KERNEL: u16 = 4;
    /// The server does not offer this.
    pub const UNSUPPORTED: u16 = 5;
    /// A peer server failed, was lost or did not answer in time.
    pub const PEER: u16 = 6;
    /// The first of the codes that carry an OpenCL error: `OPENCL_BASE + n` is the
    /// platform's `cl_int` error `-n` (1 <= n <= 255).
    pub const OPENCL_BASE: u16 = 0x100;

    /// The code carrying OpenCL error `err` (negative); errors out of range map to
    /// [`DEVICE`].
    pub fn opencl(err: i32) -> u16 {
        match err.checked_neg() {
            Some(n @ 1..=255) => OPENCL_BASE + n as u16,
            _ => DEVICE,
        }
    }

    /// The OpenCL error a code carries, if it carries one.
    pub fn as_opencl(code: u16) -> Option<i32> {
        (OPENCL_BASE + 1..=OPENCL_BASE + 255).contains(&code).then(|| -((code - OPENCL_BASE) as i32))
    }
}

/// The result of one command.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done, nothing to return.
    Done,
    /// Bytes read.
    Data(Vec<u8>),
    /// The server's devices.
    Devices(Vec<DeviceInfo>),
    /// The session's counters.
    Stats(SessionStats),
    /// The command failed; nothing it would have changed was changed.
    Failed {
        /// One of [`code`].
        code: u16,
        /// What went wrong.
        message: String,
    },
}

/// One frame of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Client → server, first.
    Hello {
        /// Lowest version the client speaks.
        min_version: u16,
        /// Highest version the client speaks.
        max_version: u16,
        /// Features the client wants.
        features: u64,
        /// Largest frame the client accepts.
        max_frame: u32,
        /// A fresh random nonce.
        nonce: [u8; 16],
    },
    /// Server → client, the answer to a hello.
    Welcome {
        /// The version in force.
        version: u16,
        /// The features in force.
        features: u64,
        /// The frame limit in force, both ways.
        max_frame: u32,
        /// A fresh random nonce.
        nonce: [u8; 16],
    },
    /// Client → server: open a new session (`mac` proves the client holds the daemon's token).
    Open {
        /// HMAC of the nonces under the token.
        mac: [u8; 32],
    },
    /// Client → server: re-attach to `session` (`mac` proves the client holds its secret).
    Attach {
        /// The session's id.
        session: [u8; 16],
        /// The last reply sequence number the client received.
        last_reply: u64,
        /// HMAC of the session, nonces (or, with [`feature::CHANNEL_BOUND_ATTACH`] on a TLS
        /// link, the TLS channel and the client's nonce) and `last_reply` under the session
        /// secret.
        mac: [u8; 32],
    },
    /// Server → client: the session is open.
    Opened {
        /// The session's id.
        session: [u8; 16],
        /// How many commands may be unanswered or unacknowledged at once.
        max_inflight: u32,
        /// Proof that the server holds the token too.
        mac: [u8; 32],
    },
    /// Server → client: re-attached.
    Attached {
        /// The last command sequence number the server received (the client re-sends the
        /// ones after it).
        last_received: u64,
        /// Proof that the server holds the session secret.
        mac: [u8; 32],
    },
    /// Server → client: the handshake was refused; the server closes the connection.
    Refused {
        /// Why.
        reason: String,
    },
    /// Client → server: a command.
    Command {
        /// Its sequence number (1, 2, ...; each executed once).
        seq: u64,
        /// The last reply sequence number the client received (the server forgets replies up
        /// to it).
        ack: u64,
        /// The command.
        cmd: Command,
    },
    /// Server → client: the answer to command `seq`.
    Reply {
        /// The command's sequence number.
        seq: u64,
        /// Its result.
        outcome: Outcome,
    },
    /// Client → server: replies up to `upto` were received (when no command carries it).
    Ack {
        /// The last reply received.
        upto: u64,
    },
    /// Server → client: the session broke a rule; the server closes the connection.
    Fatal {
        /// Why.
        reason: String,
    },
    /// Server → server, instead of open/attach: a peer link of mesh `mesh` from member `from`
    /// to member `to` (`mac` proves the sender holds the mesh key).
    PeerOpen {
        /// The mesh's id.
        mesh: [u8; 16],
        /// The sender's index.
        from: u32,
        /// The receiver's index.
        to: u32,
        /// HMAC of the mesh, indices and nonces under the mesh key.
        mac: [u8; 32],
    },
    /// Server → server: the link is accepted (`mac` proves the receiver holds the key too).
    PeerOpened {
        /// HMAC under the mesh key.
        mac: [u8; 32],
    },
    /// Peer → peer: tell me when your event `event` completes (for my wait `wait`: the same
    /// wait subscribing again, after a broken link, names the same number).
    PeerSubscribe {
        /// The event.
        event: u64,
        /// The subscribing member's number for this wait.
        wait: u64,
    },
    /// Peer → peer: event `event` completed (`ok`) or can never complete (`!ok`).
    PeerNotice {
        /// The event.
        event: u64,
        /// Whether it completed.
        ok: bool,
    },
    /// Peer → peer: bytes `offset..offset+data.len()` of transfer `transfer` (`total` bytes).
    PeerData {
        /// The transfer.
        transfer: u64,
        /// Its length in bytes.
        total: u64,
        /// Where this piece goes.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Peer → peer: the first `received` bytes of transfer `transfer` arrived — sent once all
    /// of them did (the source's migrating command completes on it), and in answer to
    /// [`Frame::PeerResume`].
    PeerReceived {
        /// The transfer.
        transfer: u64,
        /// Bytes held, from the start.
        received: u64,
    },
    /// Peer → peer, after a link broke and was made again: how much of transfer `transfer` do
    /// you hold? (The source then sends the rest.)
    PeerResume {
        /// The transfer.
        transfer: u64,
    },
    /// Source → destination: transfer `transfer` may be copied GPU to GPU — bytes
    /// `offset..offset+len` of the GPU buffer that `handle` (`cuIpcGetMemHandle`) exports, once
    /// the source's event `event` (`cuIpcGetEventHandle`), recorded after the work that
    /// produces them, completed. `node` and `pid` say where the source runs. Answered by
    /// [`Frame::PeerMemDone`] or [`Frame::PeerMemRefused`] (then the bytes come as
    /// [`Frame::PeerData`]); sent again after a link was made again.
    PeerMemOffer {
        /// The transfer.
        transfer: u64,
        /// The source's machine (a hash of its boot id, else its host name).
        node: u64,
        /// The source daemon's process id.
        pid: u32,
        /// The source buffer's IPC memory handle.
        handle: [u8; 64],
        /// Where the bytes start in that buffer.
        offset: u64,
        /// How many.
        len: u64,
        /// The IPC handle of the event to wait for.
        event: [u8; 64],
    },
    /// Destination → source: the copy of transfer `transfer` is queued on the destination's
    /// GPU, before its event `event`; the source orders later work on its buffer after it.
    PeerMemDone {
        /// The transfer.
        transfer: u64,
        /// The IPC handle of the destination's event.
        event: [u8; 64],
    },
    /// Destination → source: transfer `transfer` cannot go through peer memory (why): send it
    /// over the link.
    PeerMemRefused {
        /// The transfer.
        transfer: u64,
        /// Whether no later transfer between the two can either (other hosts, a handle that
        /// does not open): the source stops offering.
        permanent: bool,
        /// Why.
        reason: String,
    },
    /// Source → destination: the buffer `handle` exported is freed; close its mapping.
    PeerMemClose {
        /// The buffer's IPC memory handle.
        handle: [u8; 64],
    },
}

/// The bytes a [`Frame::PeerData`] needs besides its data.
pub const PEER_DATA_OVERHEAD: usize = 1 + 8 + 8 + 8 + 4;

// ---------------------------------------------------------------------------------------------
// Encoding

struct Enc<'a>(&'a mut Vec<u8>);

impl Enc<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn raw(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.raw(v);
    }
    fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
}

impl Command {
    fn tag(&self) -> u8 {
        match self {
            Command::Nop => 0,
            Command::Devices => 1,
            Command::CreateQueue { .. } => 2,
            Command::Alloc { .. } => 3,
            Command::Free { .. } => 4,
            Command::Write { .. } => 5,
            Command::Read { .. } => 6,
            Command::Copy { .. } => 7,
            Command::Fill { .. } => 8,
            Command::Launch { .. } => 9,
            Command::CompileCuda { .. } => 10,
            Command::Record { .. } => 11,
            Command::WaitEvent { .. } => 12,
            Command::SyncEvent { .. } => 13,
            Command::Finish { .. } => 14,
            Command::Stats => 15,
            Command::JoinMesh { .. } => 16,
            Command::MigrateOut { .. } => 17,
            Command::MigrateIn { .. } => 18,
            Command::WaitRemote { .. } => 19,
            Command::SetContentSize { .. } => 20,
            Command::ClBuild { .. } => 21,
            Command::ClKernel { .. } => 22,
            Command::ClLaunch { .. } => 23,
            Command::ClQuery { .. } => 24,
            Command::ClRelease { .. } => 25,
            Command::ClCompile { .. } => 26,
            Command::ClLink { .. } => 27,
            Command::ReleaseEvents { .. } => 28,
        }
    }

    fn encode(&self, e: &mut Enc) {
        e.u8(self.tag());
        match self {
            Command::Nop | Command::Devices | Command::Stats => {}
            Command::CreateQueue { queue, device } => {
                e.u64(*queue);
                e.u32(*device);
            }
            Command::Alloc { buffer, device, bytes } => {
                e.u64(*buffer);
                e.u32(*device);
                e.u64(*bytes);
            }
            Command::Free { buffer } => e.u64(*buffer),
            Command::Write { buffer, offset, data } => {
                e.u64(*buffer);
                e.u64(*offset);
                e.bytes(data);
            }
            Command::Read { buffer, offset, len } => {
                e.u64(*buffer);
                e.u64(*offset);
                e.u64(*len);
            }
            Command::Copy { src, src_offset, dst, dst_offset, len } => {
                for v in [*src, *src_offset, *dst, *dst_offset, *len] {
                    e.u64(v);
                }
            }
            Command::Fill { buffer, offset, len, pattern } => {
                e.u64(*buffer);
                e.u64(*offset);
                e.u64(*len);
                e.bytes(pattern);
            }
            Command::Launch { queue, kernel, args, range } => {
                e.u64(*queue);
                e.str(kernel);
                e.u64(*range);
                e.u32(args.len() as u32);
                for a in args {
                    match *a {
                        Arg::Buffer(v) => {
                            e.u8(0);
                            e.u64(v);
                        }
                        Arg::U64(v) => {
                            e.u8(1);
                            e.u64(v);
                        }
                        Arg::I64(v) => {
                            e.u8(2);
                            e.u64(v as u64);
                        }
                        Arg::F64(v) => {
                            e.u8(3);
                            e.u64(v.to_bits());
                        }
                        Arg::F32(v) => {
                            e.u8(4);
                            e.u64(v.to_bits() as u64);
                        }
                    }
                }
            }
            Command::CompileCuda { device, name, source } => {
                e.u32(*device);
                e.str(name);
                e.str(source);
            }
            Command::Record { queue, event } | Command::WaitEvent { queue, event } => {
                e.u64(*queue);
                e.u64(*event);
            }
            Command::SyncEvent { event } => e.u64(*event),
            Command::Finish { queue } => e.u64(*queue),
            Command::JoinMesh { mesh, key, index, peers } => {
                e.raw(mesh);
                e.raw(key);
                e.u32(*index);
                e.u32(peers.len() as u32);
                for p in peers {
                    e.u32(p.index);
                    e.str(&p.address);
                    e.raw(&p.pin);
                }
            }
            Command::MigrateOut { buffer, offset, len, peer, transfer } | Command::MigrateIn { buffer, offset, len, peer, transfer } => {
                e.u64(*buffer);
                e.u64(*offset);
                e.u64(*len);
                e.u32(*peer);
                e.u64(*transfer);
            }
            Command::WaitRemote { peer, event } => {
                e.u32(*peer);
                e.u64(*event);
            }
            Command::ReleaseEvents { events } => {
                e.u32(events.len() as u32);
                for (event, waits) in events {
                    e.u64(*event);
                    e.u64(*waits);
                }
            }
            Command::SetContentSize { buffer, size_buffer } => {
                e.u64(*buffer);
                e.u64(*size_buffer);
            }
            Command::ClBuild { program, device, source, options } => {
                e.u64(*program);
                e.u32(*device);
                e.str(source);
                e.str(options);
            }
            Command::ClKernel { kernel, program, name } => {
                e.u64(*kernel);
                e.u64(*program);
                e.str(name);
            }
            Command::ClLaunch { queue, kernel, dims, offset, global, local, args } => {
                e.u64(*queue);
                e.u64(*kernel);
                e.u8(*dims);
                for v in offset.iter().chain(global).chain(local) {
                    e.u64(*v);
                }
                e.u32(args.len() as u32);
                for a in args {
                    match a {
                        ClArg::Mem { buffer, offset, len } => {
                            e.u8(0);
                            e.u64(*buffer);
                            e.u64(*offset);
                            e.u64(*len);
                        }
                        ClArg::NullMem => e.u8(1),
                        ClArg::Value(v) => {
                            e.u8(2);
                            e.bytes(v);
                        }
                        ClArg::Local(n) => {
                            e.u8(3);
                            e.u64(*n);
                        }
                    }
                }
            }
            Command::ClQuery { what, object, device, param } => {
                e.u8(*what);
                e.u64(*object);
                e.u32(*device);
                e.u32(*param);
            }
            Command::ClRelease { what, id } => {
                e.u8(*what);
                e.u64(*id);
            }
            Command::ClCompile { program, device, source, options, headers } => {
                e.u64(*program);
                e.u32(*device);
                e.str(source);
                e.str(options);
                e.u32(headers.len() as u32);
                for (name, source) in headers {
                    e.str(name);
                    e.str(source);
                }
            }
            Command::ClLink { program, device, options, inputs } => {
                e.u64(*program);
                e.u32(*device);
                e.str(options);
                e.u32(inputs.len() as u32);
                for id in inputs {
                    e.u64(*id);
                }
            }
        }
    }
}

/// One encoded frame in two parts which, written one after the other, are the frame: `head`,
/// and `bulk`, the bytes of write or read data kept in the buffer they arrived in (a large
/// frame is sent without first copying its data behind its header).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The length prefix and every field, up to and including the data's byte count.
    pub head: Vec<u8>,
    /// The data (empty for frames without any).
    pub bulk: Vec<u8>,
}

impl Encoded {
    /// The frame's length on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.bulk.len()
    }

    /// Whether nothing is left of it (a placeholder).
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.bulk.is_empty()
    }

    /// The two parts, in order.
    pub fn parts(&self) -> [&[u8]; 2] {
        [&self.head, &self.bulk]
    }

    /// Appends the whole frame to `out`.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.head);
        out.extend_from_slice(&self.bulk);
    }
}

impl Outcome {
    fn encode(&self, e: &mut Enc) {
        match self {
            Outcome::Done => e.u8(0),
            Outcome::Data(d) => {
                e.u8(1);
                e.bytes(d);
            }
            Outcome::Devices(list) => {
                e.u8(2);
                e.u32(list.len() as u32);
                for d in list {
                    e.u8(match d.kind {
                        DeviceKind::Host => 0,
                        DeviceKind::Cuda => 1,
                        DeviceKind::OpenCl => 2,
                    });
                    e.str(&d.name);
                    e.u64(d.memory);
                }
            }
            Outcome::Stats(s) => {
                e.u8(3);
                e.u64(s.executed);
                e.u64(s.launches);
                e.u64(s.bytes_in_use);
                e.u32(s.buffers);
                e.u64(s.peer_frames);
                e.u64(s.migrations_peer_memory);
                e.u64(s.migrations_network);
                e.u64(s.migrated_bytes);
                e.u64(s.peer_wait_ns);
            }
            Outcome::Failed { code, message } => {
                e.u8(4);
                e.u16(*code);
                e.str(message);
            }
        }
    }
}

impl Frame {
    /// Appends this frame, length prefix included, to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        let mut e = Enc(out);
        match self {
            Frame::Hello { min_version, max_version, features, max_frame, nonce } => {
                e.u8(1);
                e.u32(MAGIC);
                e.u16(*min_version);
                e.u16(*max_version);
                e.u64(*features);
                e.u32(*max_frame);
                e.raw(nonce);
            }
            Frame::Welcome { version, features, max_frame, nonce } => {
                e.u8(2);
                e.u16(*version);
                e.u64(*features);
                e.u32(*max_frame);
                e.raw(nonce);
            }
            Frame::Open { mac } => {
                e.u8(3);
                e.raw(mac);
            }
            Frame::Attach { session, last_reply, mac } => {
                e.u8(4);
                e.raw(session);
                e.u64(*last_reply);
                e.raw(mac);
            }
            Frame::Opened { session, max_inflight, mac } => {
                e.u8(5);
                e.raw(session);
                e.u32(*max_inflight);
                e.raw(mac);
            }
            Frame::Attached { last_received, mac } => {
                e.u8(6);
                e.u64(*last_received);
                e.raw(mac);
            }
            Frame::Refused { reason } => {
                e.u8(7);
                e.str(reason);
            }
            Frame::Command { seq, ack, cmd } => {
                e.u8(16);
                e.u64(*seq);
                e.u64(*ack);
                cmd.encode(&mut e);
            }
            Frame::Reply { seq, outcome } => {
                e.u8(17);
                e.u64(*seq);
                outcome.encode(&mut e);
            }
            Frame::Ack { upto } => {
                e.u8(18);
                e.u64(*upto);
            }
            Frame::Fatal { reason } => {
                e.u8(19);
                e.str(reason);
            }
            Frame::PeerOpen { mesh, from, to, mac } => {
                e.u8(8);
                e.raw(mesh);
                e.u32(*from);
                e.u32(*to);
                e.raw(mac);
            }
            Frame::PeerOpened { mac } => {
                e.u8(9);
                e.raw(mac);
            }
            Frame::PeerSubscribe { event, wait } => {
                e.u8(20);
                e.u64(*event);
                e.u64(*wait);
            }
            Frame::PeerNotice { event, ok } => {
                e.u8(21);
                e.u64(*event);
                e.u8(*ok as u8);
            }
            Frame::PeerData { transfer, total, offset, data } => {
                e.u8(22);
                e.u64(*transfer);
                e.u64(*total);
                e.u64(*offset);
                e.bytes(data);
            }
            Frame::PeerReceived { transfer, received } => {
                e.u8(23);
                e.u64(*transfer);
                e.u64(*received);
            }
            Frame::PeerResume { transfer } => {
                e.u8(24);
                e.u64(*transfer);
            }
            Frame::PeerMemOffer { transfer, node, pid, handle, offset, len, event } => {
                e.u8(25);
                e.u64(*transfer);
                e.u64(*node);
                e.u32(*pid);
                e.raw(handle);
                e.u64(*offset);
                e.u64(*len);
                e.raw(event);
            }
            Frame::PeerMemDone { transfer, event } => {
                e.u8(26);
                e.u64(*transfer);
                e.raw(event);
            }
            Frame::PeerMemRefused { transfer, permanent, reason } => {
                e.u8(27);
                e.u64(*transfer);
                e.u8(*permanent as u8);
                e.str(reason);
            }
            Frame::PeerMemClose { handle } => {
                e.u8(28);
                e.raw(handle);
            }
        }
        let body = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&body.to_le_bytes());
    }

    /// This frame as [`Encoded`]: write or read data (its last field) moved into `bulk`, not
    /// copied behind the head.
    pub fn encode_split(mut self) -> Encoded {
        let bulk = match &mut self {
            Frame::Command { cmd: Command::Write { data, .. }, .. } => std::mem::take(data),
            Frame::Reply { outcome: Outcome::Data(d), .. } => std::mem::take(d),
            _ => Vec::new(),
        };
        let mut head = Vec::new();
        self.encode_into(&mut head);
        if !bulk.is_empty() {
            // The head ends with the (empty) byte string's count: it and the frame's length
            // now count the bulk bytes that follow the head.
            let n = head.len();
            head[n - 4..].copy_from_slice(&(bulk.len() as u32).to_le_bytes());
            let body = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) + bulk.len() as u32;
            head[..4].copy_from_slice(&body.to_le_bytes());
        }
        Encoded { head, bulk }
    }

    /// This frame, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(&mut v);
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if n > self.left() {
            return Err(WireError::Truncated { what, need: n, left: self.left() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A count, checked against its own limit and against the bytes left (each counted item
    /// takes at least `min_item` bytes) before the caller allocates anything for it.
    fn count(&mut self, what: &'static str, limit: usize, min_item: usize) -> Result<usize, WireError> {
        let n = self.u32(what)? as usize;
        if n > limit {
            return Err(WireError::TooLong { what, len: n as u64, limit: limit as u64 });
        }
        if n.saturating_mul(min_item) > self.left() {
            return Err(WireError::Truncated { what, need: n.saturating_mul(min_item), left: self.left() });
        }
        Ok(n)
    }
    fn bytes(&mut self, what: &'static str, limit: usize) -> Result<Vec<u8>, WireError> {
        let n = self.count(what, limit, 1)?;
        Ok(self.take(n, what)?.to_vec())
    }
    fn str(&mut self, what: &'static str, limit: usize) -> Result<String, WireError> {
        let n = self.count(what, limit, 1)?;
        let b = self.take(n, what)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| WireError::BadUtf8(what))
    }
}

fn decode_command(d: &mut Dec) -> Result<Command, WireError> {
    let unbounded = usize::MAX;
    Ok(match d.u8("command tag")? {
        0 => Command::Nop,
        1 => Command::Devices,
        2 => Command::CreateQueue { queue: d.u64("queue")?, device: d.u32("device")? },
        3 => Command::Alloc { buffer: d.u64("buffer")?, device: d.u32("device")?, bytes: d.u64("bytes")? },
        4 => Command::Free { buffer: d.u64("buffer")? },
        5 => Command::Write { buffer: d.u64("buffer")?, offset: d.u64("offset")?, data: d.bytes("write data", unbounded)? },
        6 => Command::Read { buffer: d.u64("buffer")?, offset: d.u64("offset")?, len: d.u64("length")? },
        7 => Command::Copy {
            src: d.u64("source")?,
            src_offset: d.u64("source offset")?,
            dst: d.u64("destination")?,
            dst_offset: d.u64("destination offset")?,
            len: d.u64("length")?,
        },
        8 => Command::Fill {
            buffer: d.u64("buffer")?,
            offset: d.u64("offset")?,
            len: d.u64("length")?,
            pattern: d.bytes("fill pattern", MAX_PATTERN)?,
        },
        9 => {
            let queue = d.u64("queue")?;
            let kernel = d.str("kernel name", MAX_NAME)?;
            let range = d.u64("range")?;
            let n = d.count("kernel arguments", MAX_ARGS, 9)?;
            let mut args = Vec::with_capacity(n);
            for _ in 0..n {
                let tag = d.u8("argument tag")?;
                let v = d.u64("argument")?;
                args.push(match tag {
                    0 => Arg::Buffer(v),
                    1 => Arg::U64(v),
                    2 => Arg::I64(v as i64),
                    3 => Arg::F64(f64::from_bits(v)),
                    4 => Arg::F32(f32::from_bits(u32::try_from(v).map_err(|_| WireError::TooLong {
                        what: "f32 argument bits",
                        len: v,
                        limit: u32::MAX as u64,
                    })?)),
                    t => return Err(WireError::UnknownTag { what: "argument", tag: t }),
                });
            }
            Command::Launch { queue, kernel, args, range }
        }
        10 => Command::CompileCuda {
            device: d.u32("device")?,
            name: d.str("kernel name", MAX_NAME)?,
            source: d.str("CUDA source", unbounded)?,
        },
        11 => Command::Record { queue: d.u64("queue")?, event: d.u64("event")? },
        12 => Command::WaitEvent { queue: d.u64("queue")?, event: d.u64("event")? },
        13 => Command::SyncEvent { event: d.u64("event")? },
        14 => Command::Finish { queue: d.u64("queue")? },
        15 => Command::Stats,
        16 => {
            let mesh = d.array("mesh id")?;
            let key = d.array("mesh key")?;
            let index = d.u32("mesh index")?;
            let n = d.count("mesh peers", MAX_PEERS, 4 + 4 + 32)?;
            let mut peers = Vec::with_capacity(n);
            for _ in 0..n {
                peers.push(PeerSpec { index: d.u32("peer index")?, address: d.str("peer address", MAX_NAME)?, pin: d.array("peer pin")? });
            }
            Command::JoinMesh { mesh, key, index, peers }
        }
        17 => Command::MigrateOut {
            buffer: d.u64("buffer")?,
            offset: d.u64("offset")?,
            len: d.u64("length")?,
            peer: d.u32("peer")?,
            transfer: d.u64("transfer")?,
        },
        18 => Command::MigrateIn {
            buffer: d.u64("buffer")?,
            offset: d.u64("offset")?,
            len: d.u64("length")?,
            peer: d.u32("peer")?,
            transfer: d.u64("transfer")?,
        },
        19 => Command::WaitRemote { peer: d.u32("peer")?, event: d.u64("event")? },
        20 => Command::SetContentSize { buffer: d.u64("buffer")?, size_buffer: d.u64("size buffer")? },
        21 => Command::ClBuild {
            program: d.u64("program")?,
            device: d.u32("device")?,
            source: d.str("OpenCL source", unbounded)?,
            options: d.str("build options", MAX_OPTIONS)?,
        },
        22 => Command::ClKernel { kernel: d.u64("kernel")?, program: d.u64("program")?, name: d.str("kernel name", MAX_CL_KERNEL_NAME)? },
        23 => decode_cl_launch(d)?,
        24 => {
            let what = d.u8("query kind")?;
            if what > cl_query::LAST {
                return Err(WireError::UnknownTag { what: "OpenCL query", tag: what });
            }
            Command::ClQuery { what, object: d.u64("object")?, device: d.u32("device")?, param: d.u32("parameter")? }
        }
        25 => {
            let what = d.u8("object kind")?;
            if what > cl_object::KERNEL {
                return Err(WireError::UnknownTag { what: "OpenCL object", tag: what });
            }
            Command::ClRelease { what, id: d.u64("object")? }
        }
        26 => {
            let (program, device) = (d.u64("program")?, d.u32("device")?);
            let source = d.str("OpenCL source", unbounded)?;
            let options = d.str("compile options", MAX_OPTIONS)?;
            // Each header is at least its two string counts.
            let n = d.count("embedded headers", MAX_PROGRAM_INPUTS, 8)?;
            let mut headers = Vec::with_capacity(n);
            for _ in 0..n {
                headers.push((d.str("header name", MAX_NAME)?, d.str("header source", unbounded)?));
            }
            Command::ClCompile { program, device, source, options, headers }
        }
        27 => {
            let (program, device) = (d.u64("program")?, d.u32("device")?);
            let options = d.str("link options", MAX_OPTIONS)?;
            let n = d.count("linked programs", MAX_PROGRAM_INPUTS, 8)?;
            let mut inputs = Vec::with_capacity(n);
            for _ in 0..n {
                inputs.push(d.u64("linked program")?);
            }
            Command::ClLink { program, device, options, inputs }
        }
        28 => {
            let n = d.count("released events", MAX_RELEASES, 16)?;
            let mut events = Vec::with_capacity(n);
            for _ in 0..n {
                events.push((d.u64("event")?, d.u64("waits")?));
            }
            Command::ReleaseEvents { events }
        }
        t => return Err(WireError::UnknownTag { what: "command", tag: t }),
    })
}

fn decode_cl_launch(d: &mut Dec) -> Result<Command, WireError> {
    let queue = d.u64("queue")?;
    let kernel = d.u64("kernel")?;
    let dims = d.u8("dimensions")?;
    if !(1..=3).contains(&dims) {
        return Err(WireError::TooLong { what: "NDRange dimensions", len: dims as u64, limit: 3 });
    }
    let mut three = |what| -> Result<[u64; 3], WireError> { Ok([d.u64(what)?, d.u64(what)?, d.u64(what)?]) };
    let (offset, global, local) = (three("global offset")?, three("global size")?, three("local size")?);
    let n = d.count("kernel arguments", MAX_ARGS, 1)?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        args.push(match d.u8("argument tag")? {
            0 => ClArg::Mem { buffer: d.u64("buffer")?, offset: d.u64("buffer offset")?, len: d.u64("buffer part")? },
            1 => ClArg::NullMem,
            2 => ClArg::Value(d.bytes("argument value", MAX_ARG_BYTES)?),
            3 => ClArg::Local(d.u64("local size")?),
            t => return Err(WireError::UnknownTag { what: "OpenCL argument", tag: t }),
        });
    }
    Ok(Command::ClLaunch { queue, kernel, dims, offset, global, local, args })
}

fn decode_outcome(d: &mut Dec) -> Result<Outcome, WireError> {
    Ok(match d.u8("outcome tag")? {
        0 => Outcome::Done,
        1 => Outcome::Data(d.bytes("read data", usize::MAX)?),
        2 => {
            let n = d.count("device list", MAX_DEVICES, 13)?;
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                let kind = match d.u8("device kind")? {
                    0 => DeviceKind::Host,
                    1 => DeviceKind::Cuda,
                    2 => DeviceKind::OpenCl,
                    t => return Err(WireError::UnknownTag { what: "device kind", tag: t }),
                };
                list.push(DeviceInfo { kind, name: d.str("device name", MAX_NAME)?, memory: d.u64("device memory")? });
            }
            Outcome::Devices(list)
        }
        3 => Outcome::Stats(SessionStats {
            executed: d.u64("executed")?,
            launches: d.u64("launches")?,
            bytes_in_use: d.u64("bytes in use")?,
            buffers: d.u32("buffers")?,
            peer_frames: d.u64("peer frames")?,
            migrations_peer_memory: d.u64("peer-memory migrations")?,
            migrations_network: d.u64("network migrations")?,
            migrated_bytes: d.u64("migrated bytes")?,
            peer_wait_ns: d.u64("peer wait")?,
        }),
        4 => Outcome::Failed { code: d.u16("error code")?, message: d.str("error message", 4096)? },
        t => return Err(WireError::UnknownTag { what: "outcome", tag: t }),
    })
}

/// Decodes one frame body (without its length prefix). Never panics and allocates nothing
/// larger than `body` itself.
pub fn decode(body: &[u8]) -> Result<Frame, WireError> {
    let mut d = Dec { buf: body, pos: 0 };
    if body.is_empty() {
        return Err(WireError::Empty);
    }
    let f = match d.u8("frame tag")? {
        1 => {
            let magic = d.u32("magic")?;
            if magic != MAGIC {
                return Err(WireError::BadMagic(magic));
            }
            Frame::Hello {
                min_version: d.u16("min version")?,
                max_version: d.u16("max version")?,
                features: d.u64("features")?,
                max_frame: d.u32("max frame")?,
                nonce: d.array("nonce")?,
            }
        }
        2 => Frame::Welcome {
            version: d.u16("version")?,
            features: d.u64("features")?,
            max_frame: d.u32("max frame")?,
            nonce: d.array("nonce")?,
        },
        3 => Frame::Open { mac: d.array("mac")? },
        4 => Frame::Attach { session: d.array("session")?, last_reply: d.u64("last reply")?, mac: d.array("mac")? },
        5 => Frame::Opened { session: d.array("session")?, max_inflight: d.u32("max in flight")?, mac: d.array("mac")? },
        6 => Frame::Attached { last_received: d.u64("last received")?, mac: d.array("mac")? },
        7 => Frame::Refused { reason: d.str("reason", 4096)? },
        16 => Frame::Command { seq: d.u64("sequence")?, ack: d.u64("ack")?, cmd: decode_command(&mut d)? },
        17 => Frame::Reply { seq: d.u64("sequence")?, outcome: decode_outcome(&mut d)? },
        18 => Frame::Ack { upto: d.u64("ack")? },
        19 => Frame::Fatal { reason: d.str("reason", 4096)? },
        8 => Frame::PeerOpen { mesh: d.array("mesh id")?, from: d.u32("from")?, to: d.u32("to")?, mac: d.array("mac")? },
        9 => Frame::PeerOpened { mac: d.array("mac")? },
        20 => Frame::PeerSubscribe { event: d.u64("event")?, wait: d.u64("wait")? },
        21 => Frame::PeerNotice {
            event: d.u64("event")?,
            ok: match d.u8("ok")? {
                0 => false,
                1 => true,
                t => return Err(WireError::UnknownTag { what: "notice state", tag: t }),
            },
        },
        22 => Frame::PeerData {
            transfer: d.u64("transfer")?,
            total: d.u64("total")?,
            offset: d.u64("offset")?,
            data: d.bytes("peer data", usize::MAX)?,
        },
        23 => Frame::PeerReceived { transfer: d.u64("transfer")?, received: d.u64("received")? },
        24 => Frame::PeerResume { transfer: d.u64("transfer")? },
        25 => Frame::PeerMemOffer {
            transfer: d.u64("transfer")?,
            node: d.u64("node")?,
            pid: d.u32("pid")?,
            handle: d.array("memory handle")?,
            offset: d.u64("offset")?,
            len: d.u64("length")?,
            event: d.array("event handle")?,
        },
        26 => Frame::PeerMemDone { transfer: d.u64("transfer")?, event: d.array("event handle")? },
        27 => Frame::PeerMemRefused {
            transfer: d.u64("transfer")?,
            permanent: match d.u8("permanent")? {
                0 => false,
                1 => true,
                t => return Err(WireError::UnknownTag { what: "refusal kind", tag: t }),
            },
            reason: d.str("reason", 4096)?,
        },
        28 => Frame::PeerMemClose { handle: d.array("memory handle")? },
        t => return Err(WireError::UnknownTag { what: "frame", tag: t }),
    };
    if d.left() != 0 {
        return Err(WireError::Trailing(d.left()));
    }
    Ok(f)
}

impl Frame {
    /// The frame's name, as errors and logs say it.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "hello",
            Frame::Welcome { .. } => "welcome",
            Frame::Open { .. } => "open",
            Frame::Attach { .. } => "attach",
            Frame::Opened { .. } => "opened",
            Frame::Attached { .. } => "attached",
            Frame::Refused { .. } => "refused",
            Frame::Command { .. } => "command",
            Frame::Reply { .. } => "reply",
            Frame::Ack { .. } => "ack",
            Frame::Fatal { .. } => "fatal",
            Frame::PeerOpen { .. } => "peer open",
            Frame::PeerOpened { .. } => "peer opened",
            Frame::PeerSubscribe { .. } => "peer subscribe",
            Frame::PeerNotice { .. } => "peer notice",
            Frame::PeerData { .. } => "peer data",
            Frame::PeerReceived { .. } => "peer received",
            Frame::PeerResume { .. } => "peer resume",
            Frame::PeerMemOffer { .. } => "peer-memory offer",
            Frame::PeerMemDone { .. } => "peer-memory done",
            Frame::PeerMemRefused { .. } => "peer-memory refused",
            Frame::PeerMemClose { .. } => "peer-memory close",
        }
    }
}

/// A failed outcome with `code` and `message`.
pub(crate) fn failed(code: u16, message: impl Into<String>) -> Outcome {
    Outcome::Failed { code, message: message.into() }
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The connection failed or closed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer sent something that is not a valid frame.
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
}

/// Reads one frame from `r` into `buf` (reused between calls) and decodes it. A length prefix
/// over `max_frame` is refused before anything is allocated for the body, and the body's
/// room grows with the bytes that arrive (a peer that announces a large frame and sends a few
/// bytes makes this hold a few).
pub fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>, max_frame: u32) -> Result<Frame, ReadError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > max_frame {
        return Err(WireError::TooLong { what: "frame length", len: len as u64, limit: max_frame as u64 }.into());
    }
    buf.clear();
    let len = len as usize;
    if len >= DATA_APART {
        return read_data_apart(r, buf, len);
    }
    read_growing(r, buf, len)?;
    Ok(decode(buf)?)
}

/// Frames at least this long that carry write or read data have the data read straight into
/// a buffer of its own, which becomes the decoded frame's data (no copy out of `buf`).
const DATA_APART: usize = 64 << 10;

/// The bytes before the data of a frame that carries write or read data, judged from its
/// first 18 bytes (the write command's tag is the 18th); `None` for other frames.
fn data_head_len(first: &[u8]) -> Option<usize> {
    match first {
        [17, _, _, _, _, _, _, _, _, 1, ..] => Some(READ_REPLY_OVERHEAD), // a reply with data
        [16, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, 5, ..] => Some(WRITE_OVERHEAD), // a write
        _ => None,
    }
}

/// Reads the body of a frame of `len` (≥ [`DATA_APART`]) bytes: when it carries data, its head
/// into `buf` and its data into a buffer of its own; otherwise all of it into `buf`.
fn read_data_apart(r: &mut impl Read, buf: &mut Vec<u8>, len: usize) -> Result<Frame, ReadError> {
    const PEEK: usize = WRITE_OVERHEAD - 20;
    read_growing(r, buf, PEEK)?;
    let Some(head) = data_head_len(buf) else {
        read_growing(r, buf, len - PEEK)?;
        return Ok(decode(buf)?);
    };
    if head > PEEK {
        read_growing(r, buf, head - PEEK)?;
    }
    let count = u32::from_le_bytes([buf[head - 4], buf[head - 3], buf[head - 2], buf[head - 1]]) as usize;
    if head + count != len {
        // The data's count disagrees with the frame's length: the whole body decides (and
        // the decoder says what is wrong with it).
        read_growing(r, buf, len - buf.len())?;
        return Ok(decode(buf)?);
    }
    // The head decodes as the same frame with no data; the data, read apart, is then put in.
    // Its room is the count, within the frame limit the length passed: unwritten room costs
    // no memory until bytes arrive in it.
    let mut data = Vec::with_capacity(count);
    data.extend_from_slice(&buf[head..]);
    buf.truncate(head);
    buf[head - 4..head].copy_from_slice(&0u32.to_le_bytes());
    let mut frame = decode(buf)?;
    let want = count - data.len();
    if r.take(want as u64).read_to_end(&mut data)? < want {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed inside a frame").into());
    }
    match &mut frame {
        Frame::Command { cmd: Command::Write { data: d, .. }, .. } | Frame::Reply { outcome: Outcome::Data(d), .. } => *d = data,
        _ => unreachable!("data_head_len matched only writes and replies with data"),
    }
    Ok(frame)
}

impl ReadError {
    /// Whether the "frame length" read was the start of a TLS record (content type 20-23,
    /// version 3.x): the other side speaks TLS where plain frames were expected.
    pub fn is_tls_record(&self) -> bool {
        match self {
            ReadError::Wire(WireError::TooLong { what: "frame length", len, .. }) => {
                let b = (*len as u32).to_le_bytes();
                (0x14..=0x17).contains(&b[0]) && b[1] == 3 && b[2] <= 4
            }
            _ => false,
        }
    }
}

/// The first room a frame's body gets; it doubles as bytes arrive.
const FIRST_ROOM: usize = 64 << 10;

/// Appends `n` bytes read from `r` to `buf`, giving it room step by step: never more than
/// twice the bytes that arrived (or [`FIRST_ROOM`]) beyond what it held.
fn read_growing(r: &mut impl Read, buf: &mut Vec<u8>, n: usize) -> io::Result<()> {
    let end = buf.len() + n;
    while buf.len() < end {
        let start = buf.len();
        let step = (end - start).min(start.max(FIRST_ROOM));
        buf.resize(start + step, 0);
        if let Err(e) = r.read_exact(&mut buf[start..]) {
            buf.truncate(start);
            return Err(e);
        }
    }
    Ok(())
}

/// The fixed fields of a [`Frame::PeerData`], read before its data (which the reader then
/// reads straight to where they go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerDataHead {
    /// The transfer.
    pub transfer: u64,
    /// Its length in bytes.
    pub total: u64,
    /// Where this piece goes.
    pub offset: u64,
    /// The piece's length (the bytes that follow on the link).
    pub len: usize,
}

/// The length prefix and fixed fields of a [`Frame::PeerData`] carrying `len` bytes: the same
/// bytes as encoding the frame, up to its data, which the caller writes right after.
pub fn peer_data_head(transfer: u64, total: u64, offset: u64, len: usize) -> [u8; 4 + PEER_DATA_OVERHEAD] {
    let mut h = [0u8; 4 + PEER_DATA_OVERHEAD];
    h[..4].copy_from_slice(&((PEER_DATA_OVERHEAD + len) as u32).to_le_bytes());
    h[4] = 22;
    for (i, v) in [transfer, total, offset].into_iter().enumerate() {
        h[5 + 8 * i..13 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    h[29..33].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// What [`read_peer_frame`] found.
#[derive(Debug)]
pub enum PeerRead {
    /// A data piece: its fixed fields were read; its `len` bytes are next on the link.
    Data(PeerDataHead),
    /// Any other frame, decoded.
    Frame(Frame),
}

/// Reads one frame from a peer link. A [`Frame::PeerData`] is returned as its fixed fields
/// only, checked (its data's count must be the rest of the frame), so that the caller reads
/// the data straight into place; other frames are read into `buf` and decoded as
/// [`read_frame`] does. A length prefix over `max_frame` is refused before anything is read.
pub fn read_peer_frame(r: &mut impl Read, buf: &mut Vec<u8>, max_frame: u32) -> Result<PeerRead, ReadError> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
    if len > max_frame {
        return Err(WireError::TooLong { what: "frame length", len: len as u64, limit: max_frame as u64 }.into());
    }
    if len == 0 {
        return Err(WireError::Empty.into());
    }
    if head[4] == 22 && len as usize >= PEER_DATA_OVERHEAD {
        let mut f = [0u8; PEER_DATA_OVERHEAD - 1];
        r.read_exact(&mut f)?;
        let word = |i: usize| u64::from_le_bytes(f[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let count = u32::from_le_bytes(f[24..28].try_into().expect("4 bytes")) as usize;
        let rest = len as usize - PEER_DATA_OVERHEAD;
        if count != rest {
            return Err(if count > rest {
                WireError::Truncated { what: "peer data", need: count, left: rest }
            } else {
                WireError::Trailing(rest - count)
            }
            .into());
        }
        return Ok(PeerRead::Data(PeerDataHead { transfer: word(0), total: word(1), offset: word(2), len: count }));
    }
    buf.clear();
    buf.push(head[4]);
    read_growing(r, buf, len as usize - 1)?;
    Ok(PeerRead::Frame(decode(buf)?))
}

/// Encodes `frame` into `buf` (reused between calls) and writes it to `w` in one write.
pub fn write_frame(w: &mut impl Write, buf: &mut Vec<u8>, frame: &Frame) -> io::Result<()> {
    buf.clear();
    frame.encode_into(buf);
    w.write_all(buf)
}

/// Entry points of the coverage-guided fuzz targets `remote_frame` and `remote_peer_frame`
/// (`fuzz/`) and of the tests that replay their corpora: not part of the API.
#[doc(hidden)]
pub mod fuzz {
    use super::*;

    /// Frames between a client and its daemon: `bytes` as one frame body, then as a stream of
    /// length-prefixed frames under the handshake's and the session's limits. A frame that
    /// decodes must encode to bytes that decode to the same encoding, and the reader's room
    /// stays bounded by the limit.
    pub fn frame(bytes: &[u8]) {
        if let Ok(frame) = decode(bytes) {
            let once = frame.encode();
            let again = decode(&once[4..]).expect("an encoded frame decodes");
            assert_eq!(again.encode(), once, "{frame:?} does not survive encode and decode");
            let mut joined = Vec::new();
            again.encode_split().append_to(&mut joined);
            assert_eq!(joined, once, "{frame:?} split in two parts is not the frame");
        }
        for limit in [HANDSHAKE_MAX_FRAME, MIN_MAX_FRAME] {
            let mut r = bytes;
            let mut buf = Vec::new();
            while read_frame(&mut r, &mut buf, limit).is_ok() {}
            assert!(buf.capacity() <= 2 * (limit as usize).max(FIRST_ROOM), "room {} for frames of at most {limit}", buf.capacity());
        }
    }

    /// Frames between two daemons ([`read_peer_frame`]): a data piece's fields must agree with
    /// the frame's length; its bytes are skipped as the daemon reads them.
    pub fn peer_frame(bytes: &[u8]) {
        let mut r = bytes;
        let mut buf = Vec::new();
        while let Ok(got) = read_peer_frame(&mut r, &mut buf, MIN_MAX_FRAME) {
            if let PeerRead::Data(head) = got {
                assert!(head.len + PEER_DATA_OVERHEAD <= MIN_MAX_FRAME as usize, "{head:?}");
                r = &r[head.len.min(r.len())..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_data_frames_are_read_with_their_data_apart() {
        let frames = [
            Frame::Command { seq: 7, ack: 3, cmd: Command::Write { buffer: 1, offset: 2, data: (0..200_000).map(|i| i as u8).collect() } },
            Frame::Reply { seq: 9, outcome: Outcome::Data((0..DATA_APART + 5).map(|i| (i * 7) as u8).collect()) },
            Frame::Reply { seq: 10, outcome: Outcome::Failed { code: 3, message: "x".repeat(4000) } },
            Frame::Command {
                seq: 11,
                ack: 0,
                cmd: Command::ClBuild { program: 1, device: 0, source: "y".repeat(DATA_APART), options: String::new() },
            },
        ];
        let mut stream = Vec::new();
        for f in &frames {
            f.encode_into(&mut stream);
        }
        let (mut r, mut buf) = (&stream[..], Vec::new());
        for f in &frames {
            assert_eq!(&read_frame(&mut r, &mut buf, 1 << 20).unwrap(), f);
        }
        assert!(r.is_empty());
        // Cut short inside the data: an error, not a frame.
        let mut one = frames[0].encode();
        one.truncate(one.len() - 1);
        assert!(read_frame(&mut &one[..], &mut buf, 1 << 20).is_err());
        // A data count that disagrees with the frame's length: refused as malformed.
        let mut bad = frames[1].encode();
        bad[4 + READ_REPLY_OVERHEAD - 4] ^= 1;
        assert!(matches!(read_frame(&mut &bad[..], &mut buf, 1 << 20), Err(ReadError::Wire(_))));
    }

    #[test]
    fn a_frame_split_around_its_data_is_the_frame() {
        let frames = [
            Frame::Command { seq: 7, ack: 3, cmd: Command::Write { buffer: 1, offset: 2, data: vec![9; 70_001] } },
            Frame::Command { seq: 8, ack: 3, cmd: Command::Write { buffer: 1, offset: 2, data: vec![] } },
            Frame::Reply { seq: 9, outcome: Outcome::Data((0..=255).collect()) },
            Frame::Reply { seq: 10, outcome: Outcome::Done },
            Frame::Command { seq: 11, ack: 0, cmd: Command::Read { buffer: 4, offset: 5, len: 6 } },
        ];
        for f in frames {
            let whole = f.encode();
            let split = f.clone().encode_split();
            let carries_data = matches!(&f, Frame::Reply { outcome: Outcome::Data(d), .. } if !d.is_empty())
                || matches!(&f, Frame::Command { cmd: Command::Write { data, .. }, .. } if !data.is_empty());
            assert_eq!(split.bulk.is_empty(), !carries_data, "{f:?}: data moved apart only where there is some");
            let mut joined = Vec::new();
            split.append_to(&mut joined);
            assert_eq!(joined, whole, "{f:?}");
            assert_eq!(split.len(), whole.len());
            assert_eq!(decode(&joined[4..]).unwrap(), f);
        }
    }

    #[test]
    fn a_write_command_round_trips() {
        let f = Frame::Command { seq: 7, ack: 3, cmd: Command::Write { buffer: 1, offset: 2, data: vec![1, 2, 3] } };
        let bytes = f.encode();
        assert_eq!(u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize, bytes.len() - 4);
        assert_eq!(bytes.len() - 4, WRITE_OVERHEAD + 3);
        assert_eq!(decode(&bytes[4..]).unwrap(), f);
    }

    #[test]
    fn opencl_launches_round_trip_and_bad_ones_are_refused() {
        let cmd = Command::ClLaunch {
            queue: 1,
            kernel: 2,
            dims: 2,
            offset: [1, 2, 0],
            global: [64, 32, 1],
            local: [8, 4, 1],
            args: vec![ClArg::Mem { buffer: 5, offset: 128, len: 256 }, ClArg::NullMem, ClArg::Value(vec![1, 2, 3, 4]), ClArg::Local(512)],
        };
        let f = Frame::Command { seq: 3, ack: 0, cmd };
        let bytes = f.encode();
        assert_eq!(decode(&bytes[4..]).unwrap(), f);
        // Dimensions outside 1-3 are refused.
        let mut bad = bytes[4..].to_vec();
        let dims_at = 1 + 8 + 8 + 1 + 8 + 8;
        bad[dims_at] = 4;
        assert!(matches!(decode(&bad), Err(WireError::TooLong { what: "NDRange dimensions", .. })));
        // A by-value argument over the limit is refused before it is allocated.
        let big = Frame::Command {
            seq: 4,
            ack: 0,
            cmd: Command::ClLaunch {
                queue: 1,
                kernel: 2,
                dims: 1,
                offset: [0; 3],
                global: [1; 3],
                local: [0; 3],
                args: vec![ClArg::Value(vec![0; MAX_ARG_BYTES + 1])],
            },
        };
        assert!(matches!(decode(&big.encode()[4..]), Err(WireError::TooLong { what: "argument value", .. })));
        // Unknown query kinds are refused.
        let q = Frame::Command { seq: 5, ack: 0, cmd: Command::ClQuery { what: cl_query::LAST + 1, object: 0, device: 0, param: 0 } };
        assert!(matches!(decode(&q.encode()[4..]), Err(WireError::UnknownTag { what: "OpenCL query", .. })));
    }

    #[test]
    fn opencl_compiles_links_and_long_kernel_names_round_trip_and_too_many_inputs_are_refused() {
        let compile = Command::ClCompile {
            program: 1,
            device: 0,
            source: "#include \"h.h\"\nkernel void k() {}".into(),
            options: "-DX=1".into(),
            headers: vec![("h.h".into(), "#define Y 2".into()), ("sub/i.h".into(), String::new())],
        };
        // A link of as many programs as the conformance tests link (257) and a kernel name of
        // 2048 characters fit.
        let link = Command::ClLink { program: 2, device: 0, options: "-create-library".into(), inputs: (0..257).collect() };
        let kernel = Command::ClKernel { kernel: 3, program: 2, name: "k".repeat(2048) };
        for (seq, cmd) in [compile, link, kernel].into_iter().enumerate() {
            let f = Frame::Command { seq: seq as u64, ack: 0, cmd };
            assert_eq!(decode(&f.encode()[4..]).unwrap(), f);
        }
        let many = Frame::Command {
            seq: 9,
            ack: 0,
            cmd: Command::ClLink { program: 2, device: 0, options: String::new(), inputs: vec![1; MAX_PROGRAM_INPUTS + 1] },
        };
        assert!(matches!(decode(&many.encode()[4..]), Err(WireError::TooLong { what: "linked programs", .. })));
    }

    #[test]
    fn released_events_round_trip_and_too_many_are_refused() {
        let f = Frame::Command { seq: 1, ack: 0, cmd: Command::ReleaseEvents { events: vec![(7, 0), (u64::MAX, 3)] } };
        assert_eq!(decode(&f.encode()[4..]).unwrap(), f);
        let many = Frame::Command { seq: 2, ack: 0, cmd: Command::ReleaseEvents { events: vec![(1, 1); MAX_RELEASES + 1] } };
        assert!(matches!(decode(&many.encode()[4..]), Err(WireError::TooLong { what: "released events", .. })));
    }

    #[test]
    fn opencl_errors_travel_as_codes() {
        assert_eq!(code::as_opencl(code::opencl(-11)), Some(-11));
        assert_eq!(code::as_opencl(code::opencl(-255)), Some(-255));
        assert_eq!(code::opencl(-1001), code::DEVICE);
        assert_eq!(code::opencl(0), code::DEVICE);
        assert_eq!(code::as_opencl(code::INVALID), None);
    }

    #[test]
    fn peer_data_heads_encode_like_their_frame_and_read_back() {
        let f = Frame::PeerData { transfer: 9, total: 100, offset: 40, data: vec![1, 2, 3] };
        let mut v = peer_data_head(9, 100, 40, 3).to_vec();
        v.extend_from_slice(&[1, 2, 3]);
        assert_eq!(v, f.encode());
        assert_eq!(decode(&v[4..]).unwrap(), f);
        v.extend_from_slice(&Frame::PeerNotice { event: 5, ok: true }.encode());
        let (mut r, mut buf) = (&v[..], Vec::new());
        match read_peer_frame(&mut r, &mut buf, 1024).unwrap() {
            PeerRead::Data(h) => assert_eq!(h, PeerDataHead { transfer: 9, total: 100, offset: 40, len: 3 }),
            other => panic!("{other:?}"),
        }
        let mut data = [0u8; 3];
        r.read_exact(&mut data).unwrap();
        assert_eq!(data, [1, 2, 3]);
        assert!(matches!(read_peer_frame(&mut r, &mut buf, 1024).unwrap(), PeerRead::Frame(Frame::PeerNotice { event: 5, ok: true })));
        // A count that disagrees with the frame's length is refused before any data is read.
        let mut bad = peer_data_head(9, 100, 40, 3).to_vec();
        bad[29] = 200;
        bad.extend_from_slice(&[1, 2, 3]);
        let e = read_peer_frame(&mut &bad[..], &mut buf, 1024).unwrap_err();
        assert!(e.to_string().contains("peer data needs 200 more bytes, 3 left"), "{e}");
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_before_its_body_is_read() {
        let mut wire: &[u8] = &[0xff, 0xff, 0xff, 0x7f];
        let mut buf = Vec::new();
        let e = read_frame(&mut wire, &mut buf, 1024).unwrap_err();
        assert!(e.to_string().contains("frame length of 2147483647 exceeds the limit of 1024"), "{e}");
        assert_eq!(buf.capacity(), 0, "nothing was allocated for the claimed length");
    }

    /// Ten bytes of a frame that claims 16 MiB, then the connection goes quiet.
    struct Trickle(Vec<u8>);

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::Error::new(io::ErrorKind::WouldBlock, "quiet"));
            }
            let n = out.len().min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn a_frame_that_announces_more_than_arrives_holds_room_for_what_arrived() {
        let mut head = (16u32 << 20).to_le_bytes().to_vec();
        head.extend_from_slice(&[5; 10]);
        for peer in [false, true] {
            let mut buf = Vec::new();
            let mut r = Trickle(head.clone());
            let e = if peer {
                read_peer_frame(&mut r, &mut buf, 32 << 20).unwrap_err()
            } else {
                read_frame(&mut r, &mut buf, 32 << 20).unwrap_err()
            };
            assert!(matches!(e, ReadError::Io(ref e) if e.kind() == io::ErrorKind::WouldBlock), "{e}");
            assert!(buf.capacity() < 2 * FIRST_ROOM, "{} bytes held for 10 received", buf.capacity());
        }
        // A frame that does arrive whole reads back whatever its size.
        let big = Frame::Command { seq: 1, ack: 0, cmd: Command::Write { buffer: 1, offset: 0, data: vec![3; 3 * FIRST_ROOM + 17] } };
        let mut buf = Vec::new();
        assert_eq!(read_frame(&mut &big.encode()[..], &mut buf, 1 << 20).unwrap(), big);
        assert!(buf.capacity() < 2 * big.encode().len());
    }
}
