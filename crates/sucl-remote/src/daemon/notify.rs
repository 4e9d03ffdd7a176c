//! Completion notices for events recorded behind OpenCL kernels that still run: a session in a
//! mesh has one thread that waits for those kernels, in the order they were recorded, and
//! tells the members waiting for each event (the session's commands go on meanwhile).

use super::mesh::event_done;
use super::state::*;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Weak};

/// Tells the members waiting for `r.event` once its kernel is over: at once when it is over
/// already, else from the session's notice thread (started on first use). Without a thread
/// (none could be started) the caller's thread waits.
pub(super) fn when_over(shared: &Arc<Shared>, s: &Arc<Session>, r: Recorded) {
    if r.launch.over() {
        let ok = r.launch.wait("the kernel recorded").is_ok();
        return event_done(shared, s, r.event, r.recording, ok);
    }
    let mut tx = lock(&s.notices);
    if tx.is_none() {
        *tx = start(shared.clone(), Arc::downgrade(s));
    }
    let r = match tx.as_ref() {
        Some(t) => match t.send(r) {
            Ok(()) => return,
            Err(back) => back.0, // the thread is gone: wait here
        },
        None => r,
    };
    *tx = None;
    drop(tx);
    let ok = r.launch.wait("the kernel recorded").is_ok();
    event_done(shared, s, r.event, r.recording, ok);
}

/// The notice thread: it ends when the session drops its sender (the session is gone).
fn start(shared: Arc<Shared>, session: Weak<Session>) -> Option<Sender<Recorded>> {
    let (tx, rx) = channel::<Recorded>();
    let spawned = std::thread::Builder::new().name("sucld-notice".into()).spawn(move || {
        while let Ok(r) = rx.recv() {
            let ok = r.launch.wait("the kernel recorded").is_ok();
            let Some(s) = session.upgrade() else { return };
            event_done(&shared, &s, r.event, r.recording, ok);
        }
    });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!("cannot start a notice thread ({e}): a recording waits for its kernel");
            None
        }
    }
}
