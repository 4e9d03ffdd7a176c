//! Interrupting a rank that waits: [`Communicator::interruptible`] (a check its long waits run)
//! and [`Interrupter`] (from any thread). An interrupt aborts the job as a failed rank does, so
//! that the interrupted call, this process's later calls and the other ranks' waits all end
//! with one error, "rank R was interrupted", rather than leaving a collective half done.

use crate::Communicator;
use std::sync::Arc;
use sucl_core::{AbortInfo, AbortState};

/// Aborts a job as "interrupted" from any thread (a binding's Ctrl-C). Cheap to clone.
#[derive(Clone)]
pub struct Interrupter {
    abort: Arc<AbortState>,
    world_rank: usize,
}

impl Interrupter {
    /// Aborts the job (once; later calls do nothing): every wait of this process ends with
    /// [`crate::Error::Aborted`] ("rank R was interrupted"), and the other ranks are told.
    pub fn interrupt(&self) {
        interrupt(&self.abort, self.world_rank);
    }
}

fn interrupt(abort: &AbortState, world_rank: usize) {
    if !abort.is_set() {
        abort.raise(AbortInfo { lost_rank: None, reason: format!("rank {world_rank} was interrupted") });
    }
}

impl Communicator {
    /// The [`Interrupter`] of this communicator's job, naming this rank.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter { abort: self.ctx.abort.clone(), world_rank: self.wr() }
    }

    /// Runs `f` (calls of this job made on this thread) so that a wait longer than
    /// [`sucl_core::wait::INTERRUPT_CHECK_PERIOD`] asks `interrupted` once per period whether to
    /// stop. When it says yes, the job is aborted as by [`Interrupter::interrupt`]: the waiting
    /// call returns [`crate::Error::Aborted`] ("rank R was interrupted"), every later call of
    /// this process fails the same way, and the other ranks' waits end with that error instead
    /// of running into their timeout. Short waits and calls that do not wait never ask;
    /// `interrupted` runs on this thread and must not call sucl.
    pub fn interruptible<R>(&self, interrupted: &dyn Fn() -> bool, f: impl FnOnce() -> R) -> R {
        let (abort, world_rank) = (&*self.ctx.abort, self.wr());
        let check = || {
            if !abort.is_set() && interrupted() {
                interrupt(abort, world_rank);
            }
        };
        sucl_core::wait::with_interrupt_check(&check, f)
    }
}
