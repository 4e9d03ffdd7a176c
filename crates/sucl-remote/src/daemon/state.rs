//! What the daemon holds: the state shared by its threads, and each session's.

use super::config::*;
use super::links::*;
use super::objects::*;
pub(super) use super::sync::lock;
use crate::auth::SessionSecret;
use crate::transport::Link;
use crate::wire::{Command, Encoded};
use std::collections::{HashMap, VecDeque};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

/// Receipt and replay state: guarded together, so that receiving a command, queueing it and
/// retaining its reply each happen in one step.
#[derive(Default)]
pub(super) struct SessionState {
    pub(super) last_received: u64,
    /// Received commands not yet run, in sequence order.
    pub(super) pending: VecDeque<(u64, Command)>,
    /// Someone (the connection's thread or the executor) is running `pending`.
    pub(super) draining: bool,
    /// The head of `pending` may block: the executor thread takes over.
    pub(super) handoff: bool,
    /// The session's executor thread is alive (it starts at the first command that may block
    /// and ends once it has nothing to run while the session is detached).
    pub(super) executor: bool,
    /// Encoded reply frames the client has not acknowledged, oldest first.
    pub(super) retained: VecDeque<(u64, Encoded)>,
}

/// The connection a session is bound to, guarded apart from the state so that a re-attaching
/// connection can cut off the old one even while the old one is blocked holding the state.
pub(super) struct Binding {
    pub(super) generation: u64,
    pub(super) conn: Option<Link>,
    pub(super) detached_since: Option<Instant>,
}

pub(super) struct Session {
    pub(super) id: [u8; 16],
    pub(super) secret: SessionSecret,
    pub(super) max_frame: u32,
    /// The features negotiated when it was opened (they decide how a re-attach is proved).
    pub(super) features: u64,
    pub(super) binding: Mutex<Binding>,
    pub(super) state: Mutex<SessionState>,
    pub(super) exec_cv: Condvar,
    pub(super) objects: Mutex<Objects>,
    pub(super) remote: Mutex<RemoteState>,
    pub(super) remote_cv: Condvar,
    pub(super) closed: AtomicBool,
    /// Set when the session is going (expired or evicted): no further command runs and no
    /// peer-memory offer is made, so that its offers can be settled before it closes.
    pub(super) retiring: AtomicBool,
    /// Frames received over peer links.
    pub(super) peer_frames: AtomicU64,
    /// The notice thread's queue of events recorded behind running OpenCL kernels (started on
    /// first use; its thread ends when this is dropped).
    pub(super) notices: Mutex<Option<std::sync::mpsc::Sender<Recorded>>>,
}

impl Session {
    /// Frees the session: stops its executor and its peer links and closes its connection.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        drop(lock(&self.state));
        self.exec_cv.notify_all();
        if let Some(c) = lock(&self.binding).conn.take() {
            c.shutdown();
        }
        let mut r = lock(&self.remote);
        for out in r.outs.values() {
            let mut st = lock(&out.st);
            st.closed = true;
            if let Some(l) = st.link.take() {
                l.shutdown();
            }
            drop(st);
            out.cv.notify_all();
        }
        for l in r.ins.drain(..) {
            l.shutdown();
        }
        r.inbox.clear();
        r.pool.clear();
        drop(r);
        self.remote_cv.notify_all();
    }
}

pub(super) struct Shared {
    pub(super) cfg: DaemonConfig,
    pub(super) devices: Vec<Served>,
    pub(super) sessions: Mutex<HashMap<[u8; 16], Arc<Session>>>,
    pub(super) meshes: Mutex<HashMap<[u8; 16], Weak<Session>>>,
    pub(super) stop: AtomicBool,
    /// A handle on every open connection (to close it at shutdown), by a number of its own.
    pub(super) conns: Mutex<HashMap<u64, TcpStream>>,
    pub(super) next_conn: AtomicU64,
    /// The deadlines of the connections still in their handshake, by their numbers.
    pub(super) handshakes: Mutex<HashMap<u64, Instant>>,
    pub(super) listener: TcpListener,
    pub(super) acceptors: Mutex<Acceptors>,
    pub(super) acceptors_cv: Condvar,
}

/// The threads that serve connections.
#[derive(Default)]
pub(super) struct Acceptors {
    /// Waiting in `accept` now.
    pub(super) idle: usize,
    /// Alive (waiting or serving).
    pub(super) live: usize,
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Recording `recording` of local event `event`, complete when `launch` is (for the session's
/// notice thread, `notify`).
pub(super) struct Recorded {
    pub(super) launch: crate::opencl::ClEvent,
    pub(super) event: u64,
    pub(super) recording: u64,
}
