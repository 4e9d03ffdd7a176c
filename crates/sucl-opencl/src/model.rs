//! The OpenCL objects' data and the work they do through sucl-remote: contexts, queues that
//! post commands at once (holding back only what waits for a user event not yet set), memory
//! kept coherent across daemons by server-to-server migration, programs built on the daemons,
//! kernels and events.

use crate::cl::{self, Int, Uint};
use crate::error;
use crate::object::{Data, Kind, Ref};
use crate::platform::{self, Device, Platform};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;
use sucl_remote::client::{next_transfer, Remote, RemoteError};
use sucl_remote::wire::{self, cl_query, Command, Outcome};

/// Locks, ignoring poisoning (a panic is caught at the C boundary; the data stays usable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The platform (present whenever an object exists).
pub(crate) fn plat() -> &'static Platform {
    platform::get().expect("objects exist only on an opened platform")
}

/// A device's position in the platform's list (its identity inside this library).
pub(crate) fn pos(d: &Ref<Device>) -> usize {
    plat().devices.iter().position(|x| x.same(d)).expect("a device of the platform")
}

// ---------------------------------------------------------------------------------------------
// Contexts

/// A context: devices of one or several daemons.
pub(crate) struct Context {
    pub(crate) devices: Vec<Ref<Device>>,
    pub(crate) props: Vec<isize>,
}
impl Data for Context {
    const KIND: Kind = Kind::Context;
}

impl Context {
    pub(crate) fn has(&self, d: &Ref<Device>) -> bool {
        self.devices.iter().any(|x| x.same(d))
    }
}

// ---------------------------------------------------------------------------------------------
// Events

/// What an event knows of its command.
pub(crate) struct EvState {
    /// `CL_QUEUED` (held back), `CL_SUBMITTED` (posted), `CL_COMPLETE`, or an error (< 0).
    pub(crate) status: Int,
    /// The daemon and id of the event recorded behind the command.
    pub(crate) server: Option<(usize, u64)>,
    /// Callbacks not yet run: (trigger status, function, user data).
    pub(crate) callbacks: Vec<(Int, cl::EventCallback, usize)>,
    /// A thread watches for completion.
    pub(crate) watched: bool,
    /// The daemon's profiling times, once read.
    pub(crate) profile: Option<[u64; 4]>,
    /// Waits for it posted to other daemons (told to its daemon when it is released).
    pub(crate) remote_waits: u64,
}

/// An event: of a command, or a user event.
pub(crate) struct Event {
    pub(crate) ctx: Ref<Context>,
    pub(crate) queue: Option<Ref<Queue>>,
    pub(crate) command: u32,
    /// Whether the daemon times this command (an NDRange on a profiling queue).
    pub(crate) timed: bool,
    pub(crate) state: Mutex<EvState>,
    pub(crate) changed: Condvar,
}
impl Data for Event {
    const KIND: Kind = Kind::Event;
}

impl Event {
    pub(crate) fn new(ctx: Ref<Context>, queue: Option<Ref<Queue>>, command: u32, status: Int, timed: bool) -> Ref<Event> {
        Ref::new(Event {
            ctx,
            queue,
            command,
            timed,
            state: Mutex::new(EvState { status, server: None, callbacks: Vec::new(), watched: false, profile: None, remote_waits: 0 }),
            changed: Condvar::new(),
        })
    }

    pub(crate) fn is_user(&self) -> bool {
        self.command == cl::COMMAND_USER
    }

    pub(crate) fn status(&self) -> Int {
        lock(&self.state).status
    }

    /// Whether commands that wait for it can be posted now (it is posted itself, or done).
    fn released(&self) -> bool {
        let s = lock(&self.state);
        s.status <= cl::COMPLETE || (s.status == cl::SUBMITTED && !self.is_user())
    }
}

/// A released event is released on its daemon too (each daemon event id is recorded once, so
/// that a daemon waiting for it can never take a later recording for it).
impl Drop for Event {
    fn drop(&mut self) {
        let s = lock(&self.state);
        if let (Some((srv, id)), Some(p)) = (s.server, platform::get()) {
            // A session already over has nothing left to release.
            let _ = p.servers[srv].remote.release_event(id, s.remote_waits);
        }
    }
}

/// Sets `ev`'s status and runs the callbacks it triggers.
pub(crate) fn set_status(ev: &Ref<Event>, status: Int) {
    let due = {
        let mut s = lock(&ev.state);
        s.status = status;
        let (due, keep): (Vec<_>, Vec<_>) = s.callbacks.drain(..).partition(|(t, _, _)| status <= *t);
        s.callbacks = keep;
        due
    };
    ev.changed.notify_all();
    for (_, f, data) in due {
        // SAFETY: the application registered `f` for this event with `data`; the callback
        // gets the event's handle and its status, as the specification says.
        error::guard((), || unsafe { f(ev.handle(), status, data as *mut std::ffi::c_void) });
    }
}

/// Waits (bounded) until `ev` is done; its final status.
pub(crate) fn resolve(ev: &Ref<Event>) -> Int {
    let deadline = Instant::now() + platform::timeout();
    loop {
        let (status, server) = {
            let s = lock(&ev.state);
            (s.status, s.server)
        };
        if status <= cl::COMPLETE {
            return status;
        }
        if status == cl::SUBMITTED && !ev.is_user() {
            let result = match server {
                Some((srv, id)) => plat().servers[srv].remote.call_raw(Command::SyncEvent { event: id }),
                None => Ok(Outcome::Done),
            };
            let st = match result {
                Ok(_) => cl::COMPLETE,
                Err(e) => {
                    error::report("waiting for an event", &e);
                    cl::EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST.min(error::code(&e, cl::OUT_OF_RESOURCES))
                }
            };
            set_status(ev, st);
            return st;
        }
        // Held back or a user event: wait for the application or the pump.
        let s = lock(&ev.state);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return cl::EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
        }
        if s.status == status {
            drop(ev.changed.wait_timeout(s, left.min(std::time::Duration::from_millis(50))));
        }
    }
}

/// Makes sure a thread will run `ev`'s callbacks once it completes.
pub(crate) fn watch(ev: &Ref<Event>) {
    {
        let mut s = lock(&ev.state);
        if s.watched || s.callbacks.is_empty() || ev.is_user() || s.status != cl::SUBMITTED {
            return;
        }
        s.watched = true;
    }
    let e = ev.clone();
    let _ = std::thread::Builder::new().name("sucl-cl-callback".into()).spawn(move || {
        resolve(&e);
    });
}

// ---------------------------------------------------------------------------------------------
// Queues

/// A command held back until the user events it waits for are set.
struct Held {
    waits: Vec<Ref<Event>>,
    event: Option<Ref<Event>>,
    run: Box<dyn FnOnce() -> Result<(), Int> + Send>,
}

/// A command queue on one device.
pub(crate) struct Queue {
    pub(crate) ctx: Ref<Context>,
    pub(crate) device: Ref<Device>,
    pub(crate) props: u64,
    /// The daemon's queue.
    pub(crate) id: u64,
    held: Mutex<VecDeque<Held>>,
    /// Signalled when held commands were posted.
    drained: Condvar,
}
impl Data for Queue {
    const KIND: Kind = Kind::Queue;
}

/// Queues that hold commands back.
static HOLDING: Mutex<Vec<Ref<Queue>>> = Mutex::new(Vec::new());

/// Daemon queues of released queues, by device position, for the next queue on that device
/// (a daemon queue is only a name for a device within the session, and a session holds a
/// limited number: they are reused, not made anew for every clCreateCommandQueue).
static SPARE_QUEUES: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

impl Queue {
    pub(crate) fn create(ctx: Ref<Context>, device: Ref<Device>, props: u64) -> Result<Ref<Queue>, Int> {
        let at = pos(&device);
        let spare = {
            let mut s = lock(&SPARE_QUEUES);
            s.iter().position(|(d, _)| *d == at).map(|i| s.swap_remove(i).1)
        };
        let id = match spare {
            Some(id) => id,
            None => {
                let r = plat().remote(&device);
                let id = r.new_id();
                r.call_raw(Command::CreateQueue { queue: id, device: device.index }).map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
                id
            }
        };
        Ok(Ref::new(Queue { ctx, device, props, id, held: Mutex::new(VecDeque::new()), drained: Condvar::new() }))
    }

    pub(crate) fn server(&self) -> usize {
        self.device.server
    }

    pub(crate) fn remote(&self) -> &'static Remote {
        &plat().servers[self.device.server].remote
    }

    pub(crate) fn profiling(&self) -> bool {
        self.props & cl::QUEUE_PROFILING_ENABLE != 0
    }

    /// Posts `run` (the command) once `waits` allow, and records `event` behind it. Returns
    /// at once: the command is posted now unless a user event it waits for (directly or
    /// through a held command) is not set yet, in which case it is held and posted when that
    /// event is set.
    pub(crate) fn submit(
        q: &Ref<Queue>,
        waits: Vec<Ref<Event>>,
        event: Option<Ref<Event>>,
        run: impl FnOnce() -> Result<(), Int> + Send + 'static,
    ) -> Result<(), Int> {
        let mut held = lock(&q.held);
        if !held.is_empty() || waits.iter().any(|w| !w.released()) {
            let first = held.is_empty();
            held.push_back(Held { waits, event, run: Box::new(run) });
            drop(held);
            if first {
                lock(&HOLDING).push(q.clone());
            }
            return Ok(());
        }
        drop(held);
        q.post(&waits, event.as_ref(), Box::new(run))
    }

    /// Posts one command now.
    fn post(&self, waits: &[Ref<Event>], event: Option<&Ref<Event>>, run: Box<dyn FnOnce() -> Result<(), Int> + Send>) -> Result<(), Int> {
        let failed_wait = waits.iter().any(|w| w.status() < 0);
        if failed_wait {
            if let Some(e) = event {
                set_status(e, cl::EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
            }
            return Ok(());
        }
        for w in waits {
            let server = lock(&w.state).server;
            if let Some((srv, id)) = server {
                if srv == self.server() {
                    // Another device of the same daemon: its queue runs beside this one, so the
                    // daemon waits for that event before this command (and fails it if it failed).
                    if w.queue.as_ref().is_some_and(|wq| wq.device.index != self.device.index) {
                        self.remote()
                            .post_raw(Command::WaitEvent { queue: self.id, event: id })
                            .map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
                    }
                } else {
                    let p = plat();
                    p.ensure_mesh()?;
                    let peer = p.servers[srv].remote.mesh_index().ok_or(cl::OUT_OF_RESOURCES)?;
                    self.remote().post_raw(Command::WaitRemote { peer, event: id }).map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
                    lock(&w.state).remote_waits += 1;
                }
            }
        }
        let r = run();
        if let Some(e) = event {
            match &r {
                Err(code) => set_status(e, (*code).min(-1)),
                Ok(()) => self.record(e)?,
            }
        }
        r
    }

    /// Records `e` behind everything posted so far.
    pub(crate) fn record(&self, e: &Ref<Event>) -> Result<(), Int> {
        let id = self.remote().new_id();
        self.remote().post_raw(Command::Record { queue: self.id, event: id }).map_err(|err| error::code(&err, cl::OUT_OF_RESOURCES))?;
        lock(&e.state).server = Some((self.server(), id));
        set_status(e, cl::SUBMITTED);
        watch(e);
        Ok(())
    }

    /// Posts the held commands whose waits now allow it.
    fn pump(&self) {
        loop {
            let next = {
                let mut held = lock(&self.held);
                match held.front() {
                    Some(h) if h.waits.iter().all(|w| w.released()) => held.pop_front(),
                    _ => None,
                }
            };
            let Some(h) = next else { break };
            if let Err(code) = self.post(&h.waits, h.event.as_ref(), h.run) {
                if let Some(e) = &h.event {
                    set_status(e, code.min(-1));
                }
            }
        }
        self.drained.notify_all();
    }

    /// Waits (bounded) until no command is held; `false` if the time ran out.
    pub(crate) fn wait_unheld(&self) -> bool {
        let deadline = Instant::now() + platform::timeout();
        let mut held = lock(&self.held);
        while !held.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            held = self.drained.wait_timeout(held, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    /// `clFinish`: every command posted and run.
    pub(crate) fn finish(&self) -> Result<(), Int> {
        if !self.wait_unheld() {
            return Err(cl::OUT_OF_RESOURCES);
        }
        self.remote().call_raw(Command::Finish { queue: self.id }).map(|_| ()).map_err(|e| {
            error::report("clFinish", &e);
            error::code(&e, cl::OUT_OF_RESOURCES)
        })
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        lock(&SPARE_QUEUES).push((pos(&self.device), self.id));
    }
}

/// After a user event changed: posts what waited for it, on every queue.
pub(crate) fn pump_all() {
    let queues: Vec<Ref<Queue>> = lock(&HOLDING).clone();
    for q in &queues {
        q.pump();
    }
    lock(&HOLDING).retain(|q| !lock(&q.held).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Memory

/// Where a buffer's bytes live: one daemon buffer per device that used it, and the devices
/// whose copy is current.
pub(crate) struct Store {
    pub(crate) size: usize,
    state: Mutex<StoreState>,
}

struct StoreState {
    /// Device position → daemon buffer id.
    ids: HashMap<usize, u64>,
    /// Devices whose copy is current (empty: none yet; `init` or zeros).
    valid: HashSet<usize>,
    /// The initial contents (COPY_HOST_PTR / USE_HOST_PTR), uploaded on first use.
    init: Option<Vec<u8>>,
}

impl Store {
    pub(crate) fn new(size: usize, init: Option<Vec<u8>>) -> Store {
        Store { size, state: Mutex::new(StoreState { ids: HashMap::new(), valid: HashSet::new(), init }) }
    }

    /// The daemon buffer on `dev` holding the current bytes (allocated, uploaded or migrated
    /// as needed). With `overwrite` the caller replaces all bytes, so nothing is moved.
    pub(crate) fn place(&self, dev: &Ref<Device>, overwrite: bool) -> Result<u64, Int> {
        let p = plat();
        let at = pos(dev);
        let r = p.remote(dev);
        let mut st = lock(&self.state);
        let id = match st.ids.get(&at) {
            Some(id) => *id,
            None => {
                let id = r.new_id();
                r.call_raw(Command::Alloc { buffer: id, device: dev.index, bytes: self.size as u64 }).map_err(|e| {
                    error::report("allocating a buffer", &e);
                    cl::MEM_OBJECT_ALLOCATION_FAILURE
                })?;
                st.ids.insert(at, id);
                id
            }
        };
        if st.valid.contains(&at) || overwrite {
            st.valid.insert(at);
            return Ok(id);
        }
        if st.valid.is_empty() {
            if let Some(init) = st.init.take() {
                write_chunks(r, id, 0, &init)?;
            }
        } else {
            let from = *st.valid.iter().next().expect("not empty");
            let src_dev = &p.devices[from];
            let src_id = st.ids[&from];
            if src_dev.server == dev.server {
                // Two devices of one daemon: their platforms cannot copy between them.
                let bytes = read_chunks(r, src_id, 0, self.size)?;
                write_chunks(r, id, 0, &bytes)?;
            } else {
                p.ensure_mesh()?;
                let src = p.remote(src_dev);
                let (si, di) = (src.mesh_index().ok_or(cl::OUT_OF_RESOURCES)?, r.mesh_index().ok_or(cl::OUT_OF_RESOURCES)?);
                let transfer = next_transfer();
                let len = self.size as u64;
                let post = |r: &Remote, c| r.post_raw(c).map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES));
                post(src, Command::MigrateOut { buffer: src_id, offset: 0, len, peer: di, transfer })?;
                post(r, Command::MigrateIn { buffer: id, offset: 0, len, peer: si, transfer })?;
            }
        }
        st.valid.insert(at);
        Ok(id)
    }

    /// Marks `dev`'s copy as the only current one (after a command wrote it there).
    pub(crate) fn written(&self, dev: &Ref<Device>) {
        let at = pos(dev);
        let mut st = lock(&self.state);
        st.valid.clear();
        st.valid.insert(at);
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let Some(p) = platform::get() else { return };
        for (at, id) in lock(&self.state).ids.drain() {
            let _ = p.remote(&p.devices[at]).post_raw(Command::Free { buffer: id });
        }
    }
}

/// The most bytes one write or read frame carries (less where the frame limit is lower).
/// Pieces this size keep the application's copy, the encryption, the daemon's decryption
/// and its OpenCL write working on different pieces at once, and their buffers are
/// reused by the allocator instead of being mapped (and faulted in) afresh.
pub(crate) const PIECE: usize = 1 << 20;

fn write_piece(r: &Remote) -> usize {
    (r.max_frame() - wire::WRITE_OVERHEAD - 4).clamp(1, PIECE)
}

/// `data` split into pieces that each fit one write frame, each copied (when the iterator
/// reaches it) into a data buffer reused from answered writes: the one copy a write makes on
/// this side, as each piece becomes its command's data as is.
fn copied_pieces<'a>(r: &'a Remote, data: &'a [u8]) -> impl Iterator<Item = Vec<u8>> + 'a {
    data.chunks(write_piece(r)).map(|chunk| {
        let mut piece = r.data_buffer(chunk.len());
        piece.extend_from_slice(chunk);
        piece
    })
}

/// Copies `data` into pieces now, for a write posted later.
pub(crate) fn pieces(r: &Remote, data: &[u8]) -> Vec<Vec<u8>> {
    copied_pieces(r, data).collect()
}

/// Posts `data` into daemon buffer `id` at `offset`, split to fit frames: each piece is
/// copied just before it is posted (never a copy of the whole).
pub(crate) fn write_chunks(r: &Remote, id: u64, offset: usize, data: &[u8]) -> Result<(), Int> {
    write_pieces(r, id, offset, copied_pieces(r, data))
}

/// The application's bytes of a blocking write, read by the command while the call that
/// passed them still waits (the memory is the application's again once the call returns).
pub(crate) struct BorrowedHost {
    ptr: usize,
    len: usize,
    /// Whether the call is still waiting; held while the bytes are read.
    waiting: Mutex<bool>,
}

impl BorrowedHost {
    /// # Safety
    /// `ptr` must point to `len` readable bytes until [`BorrowedHost::release`] returns.
    pub(crate) unsafe fn new(ptr: *const u8, len: usize) -> BorrowedHost {
        BorrowedHost { ptr: ptr as usize, len, waiting: Mutex::new(true) }
    }

    /// Runs `f` on the bytes if the call still waits; `None` once it has returned (a command
    /// run after its blocking call gave up, on a timeout, must not read the memory).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let waiting = lock(&self.waiting);
        // SAFETY: while `waiting` is true and its lock held, `release` has not returned, so
        // the bytes are readable (the contract of `new`).
        (*waiting).then(|| f(unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }))
    }

    /// The call returns: from now on the bytes are not read (waits for a read under way).
    pub(crate) fn release(&self) {
        *lock(&self.waiting) = false;
    }
}

/// Posts write pieces (from [`pieces`], or copied as they go) into daemon buffer `id` from
/// `offset` on.
pub(crate) fn write_pieces(r: &Remote, id: u64, offset: usize, parts: impl IntoIterator<Item = Vec<u8>>) -> Result<(), Int> {
    let mut at = offset;
    for part in parts {
        let n = part.len();
        r.post_raw(Command::Write { buffer: id, offset: at as u64, data: part }).map_err(|e| error::code(&e, cl::OUT_OF_RESOURCES))?;
        at += n;
    }
    Ok(())
}

/// Reads `len` bytes of daemon buffer `id` at `offset`.
pub(crate) fn read_chunks(r: &Remote, id: u64, offset: usize, len: usize) -> Result<Vec<u8>, Int> {
    let mut out = vec![0; len];
    read_into(r, id, offset, &mut out)?;
    Ok(out)
}

/// Reads sent ahead of the one being waited for: the daemon answers the next while this
/// side copies the last, instead of one round trip per piece.
const READS_AHEAD: usize = 8;

/// Reads `out.len()` bytes of daemon buffer `id` at `offset` into `out`, piece by piece,
/// with up to [`READS_AHEAD`] pieces asked for at once.
pub(crate) fn read_into(r: &Remote, id: u64, offset: usize, out: &mut [u8]) -> Result<(), Int> {
    let chunk = (r.max_frame() - wire::READ_REPLY_OVERHEAD - 4).clamp(1, PIECE);
    let mut asked = VecDeque::with_capacity(READS_AHEAD);
    let mut result: Result<(), Option<RemoteError>> = Ok(());
    for (i, dst) in out.chunks_mut(chunk).enumerate() {
        if result.is_err() {
            break;
        }
        match r.send_raw(Command::Read { buffer: id, offset: (offset + i * chunk) as u64, len: dst.len() as u64 }) {
            Ok(seq) => asked.push_back((seq, dst)),
            Err(e) => result = Err(Some(e)),
        }
        if asked.len() == READS_AHEAD {
            if let Some((seq, dst)) = asked.pop_front() {
                result = result.and(take_read(r, seq, dst));
            }
        }
    }
    // Every read asked for is collected, so no answer is left waiting for nobody.
    for (seq, dst) in asked {
        result = result.and(take_read(r, seq, dst));
    }
    result.map_err(|e| match e {
        Some(e) => {
            error::report("reading a buffer", &e);
            error::code(&e, cl::OUT_OF_RESOURCES)
        }
        None => cl::OUT_OF_RESOURCES,
    })
}

/// Waits for the read sent as `seq` and copies its bytes to `dst`; `Err(None)` when the
/// daemon answered with something else.
fn take_read(r: &Remote, seq: u64, dst: &mut [u8]) -> Result<(), Option<RemoteError>> {
    match r.answer_raw(seq) {
        Ok(Outcome::Data(d)) if d.len() == dst.len() => {
            dst.copy_from_slice(&d);
            Ok(())
        }
        Ok(_) => Err(None),
        Err(e) => Err(Some(e)),
    }
}

/// One mapping of a buffer.
pub(crate) struct Mapping {
    pub(crate) offset: usize,
    pub(crate) size: usize,
    pub(crate) flags: u64,
    /// The host memory the mapping returned (owned here unless it is the USE_HOST_PTR memory).
    pub(crate) owned: Option<Vec<u8>>,
}

/// A buffer or sub-buffer.
pub(crate) struct Mem {
    pub(crate) ctx: Ref<Context>,
    pub(crate) flags: u64,
    pub(crate) size: usize,
    pub(crate) host_ptr: usize,
    /// For a sub-buffer: its buffer and its offset in it.
    pub(crate) parent: Option<(Ref<Mem>, usize)>,
    pub(crate) store: std::sync::Arc<Store>,
    /// This object's first byte in the store.
    pub(crate) base: usize,
    pub(crate) maps: Mutex<HashMap<usize, Mapping>>,
    pub(crate) destructors: Mutex<Vec<(cl::MemCallback, usize)>>,
    /// The handle the application knows (destructor callbacks get it).
    pub(crate) handle: std::sync::atomic::AtomicUsize,
}
impl Data for Mem {
    const KIND: Kind = Kind::Mem;
}

impl Drop for Mem {
    fn drop(&mut self) {
        let list = std::mem::take(&mut *lock(&self.destructors));
        for (f, data) in list.into_iter().rev() {
            // SAFETY: the application registered `f` with `data` for this object; the
            // specification calls it with the (now released) handle's value.
            let h = self.handle.load(std::sync::atomic::Ordering::Acquire);
            error::guard((), || unsafe { f(h as cl::Handle, data as *mut std::ffi::c_void) });
        }
    }
}

impl Mem {
    /// Checks `offset..offset + len` lies inside.
    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<(), Int> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(cl::INVALID_VALUE),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Programs and kernels

/// One device's build, compilation or link of a program.
#[derive(Clone)]
pub(crate) struct Build {
    pub(crate) status: Int,
    pub(crate) log: String,
    pub(crate) options: String,
    /// The daemon's program (also kept when the build failed).
    pub(crate) id: Option<u64>,
    /// What a successful one made (`CL_PROGRAM_BINARY_TYPE_*`; `NONE` when it failed).
    pub(crate) binary: Uint,
}

/// A program from OpenCL C source, or linked from compiled ones (no source).
pub(crate) struct Program {
    pub(crate) ctx: Ref<Context>,
    pub(crate) source: String,
    pub(crate) builds: Mutex<HashMap<usize, Build>>,
    /// Kernels made from it and alive (a build is refused while any are).
    pub(crate) kernels: std::sync::atomic::AtomicU32,
}
impl Data for Program {
    const KIND: Kind = Kind::Program;
}

/// The source a daemon compiles for `source`: the compiler must say what the devices report,
/// OpenCL 1.2 (`__OPENCL_VERSION__`, which the daemon's platform sets to its own version) and
/// no image support (`__IMAGE_SUPPORT__`, defined when the daemon's device has images);
/// `#line 1` keeps the log's line numbers the application's.
fn device_source(source: &str) -> String {
    format!("#undef __IMAGE_SUPPORT__\n#undef __OPENCL_VERSION__\n#define __OPENCL_VERSION__ 120\n#line 1\n{source}")
}

/// The build or compile options a daemon gets for `options`: without `-cl-std`, the
/// specification's default for the devices' version, OpenCL C 1.2 (a platform of a later
/// version may default to its own, which these devices do not report).
fn device_options(options: &str) -> String {
    if options.split_whitespace().any(|o| o.starts_with("-cl-std=")) {
        options.to_string()
    } else {
        format!("{options} -cl-std=CL1.2")
    }
}

/// What one kind of program making (build, compile, link) is called and answers.
struct Making {
    /// What a success makes (`CL_PROGRAM_BINARY_TYPE_*`).
    binary: Uint,
    /// The code of a failure that leaves a program with a log.
    failure: Int,
    /// The code for options the platform refused.
    bad_options: Int,
    what: &'static str,
}

impl Program {
    /// A program of `ctx` with no source and nothing built yet (a link's result).
    pub(crate) fn linked(ctx: Ref<Context>) -> Program {
        Program { ctx, source: String::new(), builds: Mutex::new(HashMap::new()), kernels: Default::default() }
    }

    /// Builds for `devices`: every device's build runs on its daemon.
    pub(crate) fn build(&self, devices: &[Ref<Device>], options: &str) -> Result<(), Int> {
        let how = Making {
            binary: cl::PROGRAM_BINARY_TYPE_EXECUTABLE,
            failure: cl::BUILD_PROGRAM_FAILURE,
            bad_options: cl::INVALID_BUILD_OPTIONS,
            what: "building a program",
        };
        self.make(devices, options, &how, |program, d| Command::ClBuild {
            program,
            device: d.index,
            source: device_source(&self.source),
            options: device_options(options),
        })
    }

    /// Compiles for `devices` into compiled objects (`clCompileProgram`), with the embedded
    /// headers (include name, source).
    pub(crate) fn compile(&self, devices: &[Ref<Device>], options: &str, headers: &[(String, String)]) -> Result<(), Int> {
        if headers.len() > wire::MAX_PROGRAM_INPUTS || headers.iter().any(|(name, _)| name.len() > wire::MAX_NAME) {
            return Err(cl::OUT_OF_RESOURCES); // more than the daemon takes
        }
        let how = Making {
            binary: cl::PROGRAM_BINARY_TYPE_COMPILED_OBJECT,
            failure: cl::COMPILE_PROGRAM_FAILURE,
            bad_options: cl::INVALID_COMPILER_OPTIONS,
            what: "compiling a program",
        };
        self.make(devices, options, &how, |program, d| Command::ClCompile {
            program,
            device: d.index,
            source: device_source(&self.source),
            options: device_options(options),
            headers: headers.to_vec(),
        })
    }

    /// Links `inputs` (each compiled or a library for every one of `devices`) into this
    /// (new) program: an executable, or a library with `-create-library`.
    pub(crate) fn link(&self, devices: &[Ref<Device>], options: &str, inputs: &[Ref<Program>]) -> Result<(), Int> {
        if inputs.len() > wire::MAX_PROGRAM_INPUTS {
            return Err(cl::OUT_OF_RESOURCES); // more than the daemon takes in one link
        }
        let library = options.split_whitespace().any(|o| o == "-create-library");
        let how = Making {
            binary: if library { cl::PROGRAM_BINARY_TYPE_LIBRARY } else { cl::PROGRAM_BINARY_TYPE_EXECUTABLE },
            failure: cl::LINK_PROGRAM_FAILURE,
            bad_options: cl::INVALID_LINKER_OPTIONS,
            what: "linking programs",
        };
        let mut ids = Vec::with_capacity(devices.len());
        for d in devices {
            let mut on_d = Vec::with_capacity(inputs.len());
            for p in inputs {
                on_d.push(p.linkable(d).ok_or(cl::INVALID_OPERATION)?);
            }
            ids.push(on_d);
        }
        self.make(devices, options, &how, |program, d| Command::ClLink {
            program,
            device: d.index,
            options: options.into(),
            inputs: ids[devices.iter().position(|x| x.same(d)).expect("one of devices")].clone(),
        })
    }

    /// Runs `command` (a new daemon program's id, the device) on each device's daemon and
    /// records what it made.
    fn make(
        &self,
        devices: &[Ref<Device>],
        options: &str,
        how: &Making,
        command: impl Fn(u64, &Ref<Device>) -> Command,
    ) -> Result<(), Int> {
        if device_options(options).len() > wire::MAX_OPTIONS {
            return Err(how.bad_options);
        }
        let p = plat();
        let mut failed = false;
        for d in devices {
            let r = p.remote(d);
            let id = r.new_id();
            let log_of = || query(r, cl_query::PROGRAM_BUILD, id, d.index, cl::PROGRAM_BUILD_LOG).map(|v| text(&v));
            let b = match r.call_raw(command(id, d)) {
                Ok(_) => Build {
                    status: cl::BUILD_SUCCESS,
                    log: log_of().unwrap_or_default(),
                    options: options.into(),
                    id: Some(id),
                    binary: how.binary,
                },
                Err(e) if error::code(&e, 0) == how.failure => {
                    failed = true;
                    // A failed link may leave no program on the daemon: asking for its log tells.
                    let kept = log_of().is_ok();
                    let id = kept.then_some(id);
                    Build {
                        status: cl::BUILD_ERROR,
                        log: error::message(&e),
                        options: options.into(),
                        id,
                        binary: cl::PROGRAM_BINARY_TYPE_NONE,
                    }
                }
                Err(e) if error::code(&e, 0) == how.bad_options => return Err(how.bad_options),
                Err(e) => {
                    error::report(how.what, &e);
                    return Err(error::code(&e, cl::OUT_OF_RESOURCES));
                }
            };
            if let Some(old) = lock(&self.builds).insert(pos(d), b).and_then(|b| b.id) {
                let _ = r.post_raw(Command::ClRelease { what: wire::cl_object::PROGRAM, id: old });
            }
        }
        if failed {
            Err(how.failure)
        } else {
            Ok(())
        }
    }

    /// The daemon's compiled object or library for `d`, which a link can take.
    fn linkable(&self, d: &Ref<Device>) -> Option<u64> {
        let builds = lock(&self.builds);
        let b = builds.get(&pos(d)).filter(|b| b.status == cl::BUILD_SUCCESS)?;
        [cl::PROGRAM_BINARY_TYPE_COMPILED_OBJECT, cl::PROGRAM_BINARY_TYPE_LIBRARY].contains(&b.binary).then_some(b.id?)
    }

    /// The successful build for `d` that made an executable.
    pub(crate) fn built(&self, d: &Ref<Device>) -> Option<u64> {
        lock(&self.builds)
            .get(&pos(d))
            .filter(|b| b.status == cl::BUILD_SUCCESS && b.binary == cl::PROGRAM_BINARY_TYPE_EXECUTABLE)
            .and_then(|b| b.id)
    }

    /// Any successful build of an executable: (device, daemon program).
    pub(crate) fn any_built(&self) -> Option<(Ref<Device>, u64)> {
        let builds = lock(&self.builds);
        builds
            .iter()
            .find(|(_, b)| b.status == cl::BUILD_SUCCESS && b.binary == cl::PROGRAM_BINARY_TYPE_EXECUTABLE)
            .and_then(|(at, b)| Some((plat().devices[*at].clone(), b.id?)))
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let p = plat();
        for (at, b) in lock(&self.builds).drain() {
            if let Some(id) = b.id {
                let _ = p.remote(&p.devices[at]).post_raw(Command::ClRelease { what: wire::cl_object::PROGRAM, id });
            }
        }
    }
}

/// An OpenCL info query to a daemon.
pub(crate) fn query(r: &Remote, what: u8, object: u64, device: u32, param: u32) -> Result<Vec<u8>, Int> {
    match r.call_raw(Command::ClQuery { what, object, device, param }) {
        Ok(Outcome::Data(v)) => Ok(v),
        Ok(_) => Err(cl::INVALID_VALUE),
        Err(e) => Err(error::code(&e, cl::INVALID_VALUE)),
    }
}

/// A NUL-terminated answer as text.
pub(crate) fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

/// A kernel argument as set by the application.
#[derive(Clone)]
pub(crate) enum ArgVal {
    /// A buffer's handle: a kernel argument does not keep its buffer (the specification says
    /// so: its destructor runs once the application released it); a launch takes it.
    Mem(usize),
    NullMem,
    Value(Vec<u8>),
    Local(usize),
}

/// A kernel.
pub(crate) struct Kernel {
    pub(crate) program: Ref<Program>,
    pub(crate) name: String,
    /// Each argument's address qualifier (`CL_KERNEL_ARG_ADDRESS_*`; 0 unknown).
    pub(crate) quals: Vec<u32>,
    /// Each argument: whether the kernel only reads it (`__constant`, or a pointer to
    /// `const`), so that a launch leaves the other devices' copies of its buffer current.
    pub(crate) read_only: Vec<bool>,
    pub(crate) args: Mutex<Vec<Option<ArgVal>>>,
    /// Device position → the daemon's kernel.
    pub(crate) ids: Mutex<HashMap<usize, u64>>,
    /// Argument index → the size its by-value type takes, once asked (`None`: not known).
    pub(crate) value_sizes: Mutex<HashMap<u32, Option<usize>>>,
}
impl Data for Kernel {
    const KIND: Kind = Kind::Kernel;
}

impl Kernel {
    /// Makes the kernel on `d`'s daemon: the daemon's kernel id, each argument's address
    /// qualifier and whether the kernel only reads it.
    pub(crate) fn make(d: &Ref<Device>, program: u64, name: &str) -> Result<(u64, Vec<u32>, Vec<bool>), Int> {
        if name.len() > wire::MAX_CL_KERNEL_NAME {
            return Err(cl::INVALID_KERNEL_NAME); // longer than any name the daemon takes
        }
        let r = plat().remote(d);
        let id = r.new_id();
        let v = match r.call_raw(Command::ClKernel { kernel: id, program, name: name.into() }) {
            Ok(Outcome::Data(v)) => v,
            Ok(_) => return Err(cl::INVALID_KERNEL_NAME),
            Err(e) => return Err(error::code(&e, cl::INVALID_KERNEL_NAME)),
        };
        // The answer: the argument count n, n address qualifiers, n read-only flags.
        let words: Vec<u32> = v.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
        let n = words.first().map_or(0, |n| *n as usize).min(words.len().saturating_sub(1));
        let quals = words.get(1..1 + n).unwrap_or_default().to_vec();
        let read_only = (0..n).map(|i| words.get(1 + n + i).is_some_and(|f| *f == 1)).collect();
        Ok((id, quals, read_only))
    }

    /// The daemon's kernel for `d` (made there on first use).
    pub(crate) fn on(&self, d: &Ref<Device>) -> Result<u64, Int> {
        let at = pos(d);
        if let Some(id) = lock(&self.ids).get(&at) {
            return Ok(*id);
        }
        let prog = self.program.built(d).ok_or(cl::INVALID_PROGRAM_EXECUTABLE)?;
        let (id, _, _) = Kernel::make(d, prog, &self.name)?;
        lock(&self.ids).insert(at, id);
        Ok(id)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let p = plat();
        for (at, id) in lock(&self.ids).drain() {
            let _ = p.remote(&p.devices[at]).post_raw(Command::ClRelease { what: wire::cl_object::KERNEL, id });
        }
        self.program.kernels.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Raw pointers handed through closures that run later (held commands): the application
/// keeps the memory valid until the command completes, as the specification requires.
#[derive(Clone, Copy)]
pub(crate) struct HostPtr(pub(crate) usize);

impl HostPtr {
    pub(crate) fn of(p: *const std::ffi::c_void) -> HostPtr {
        HostPtr(p as usize)
    }
    pub(crate) fn get(self) -> *mut u8 {
        self.0 as *mut u8
    }
}

/// A handle value for a C array of handles.
pub(crate) fn handles<T: Data>(list: &[Ref<T>]) -> Vec<u8> {
    list.iter().flat_map(|r| (r.handle() as usize).to_ne_bytes()).collect()
}
