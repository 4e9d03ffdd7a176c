//! Bounded waiting: spin, then yield, then sleep or block, never past the timeout, and never
//! past an abort raised by another rank.
//!
//! A thread may also install an interrupt check ([`with_interrupt_check`]): every wait on that
//! thread that has lasted [`INTERRUPT_CHECK_PERIOD`] runs it once per period, then looks at the
//! abort flag again. A language binding uses it to notice Ctrl-C while its caller is blocked in
//! sucl (the check raises the job's abort); short waits never run it.

use crate::error::{AbortState, Error, Result};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How often a long wait runs its thread's interrupt check (the first time after one period).
pub const INTERRUPT_CHECK_PERIOD: Duration = Duration::from_millis(50);

/// The erased-lifetime pointer to the check installed on a thread.
type CheckPtr = *const (dyn Fn() + 'static);

thread_local! {
    static INTERRUPT_CHECK: Cell<Option<CheckPtr>> = const { Cell::new(None) };
}

/// Runs `f` with `check` installed as this thread's interrupt check: each wait inside `f` that
/// lasts longer than [`INTERRUPT_CHECK_PERIOD`] calls `check` once per period, then ends with
/// the abort error if the abort flag it watches is raised (a check interrupts a wait by raising
/// that abort). The previous check (if any) is restored when `f` returns or unwinds. While
/// `check` runs it is uninstalled, so a wait inside it does not run it again.
pub fn with_interrupt_check<R>(check: &dyn Fn(), f: impl FnOnce() -> R) -> R {
    struct Restore(Option<CheckPtr>);
    impl Drop for Restore {
        fn drop(&mut self) {
            INTERRUPT_CHECK.set(self.0);
        }
    }
    let ptr: *const (dyn Fn() + '_) = check;
    // SAFETY: only the lifetime is erased (same layout). The pointer is dereferenced only by
    // `run_interrupt_check` on this thread while it is installed, i.e. within this call, where
    // `check` is borrowed; `Restore` uninstalls it before this frame ends, also on unwinding.
    let ptr: CheckPtr = unsafe { std::mem::transmute::<*const (dyn Fn() + '_), CheckPtr>(ptr) };
    let _restore = Restore(INTERRUPT_CHECK.replace(Some(ptr)));
    f()
}

/// Runs this thread's interrupt check, if one is installed.
fn run_interrupt_check() {
    let Some(ptr) = INTERRUPT_CHECK.take() else { return };
    struct Reinstall(CheckPtr);
    impl Drop for Reinstall {
        fn drop(&mut self) {
            INTERRUPT_CHECK.set(Some(self.0));
        }
    }
    let _reinstall = Reinstall(ptr);
    // SAFETY: `ptr` was installed by `with_interrupt_check`, whose frame (and the borrow of the
    // check) is live below this one on this thread: it uninstalls the pointer before returning.
    unsafe { (*ptr)() }
}

/// How long a wait busy-polls and then yields before it blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Busy-polling time (lowest latency; zero when ranks outnumber cores).
    pub spin: Duration,
    /// Time spent yielding the core between polls after spinning.
    pub yield_for: Duration,
}

impl Backoff {
    /// For a host whose ranks fit its cores: spin 50 µs, yield 200 µs.
    pub const DEDICATED: Backoff = Backoff { spin: Duration::from_micros(50), yield_for: Duration::from_micros(200) };
    /// For an oversubscribed host: give the core away at once.
    pub const OVERSUBSCRIBED: Backoff = Backoff { spin: Duration::ZERO, yield_for: Duration::from_micros(200) };

    /// The backoff for `local_ranks` processes on this host.
    pub fn for_local_ranks(local_ranks: usize) -> Backoff {
        // The host's CPUs, not this process's affinity mask: a launcher that pins each rank to
        // one CPU does so precisely because the ranks fit.
        // SAFETY: sysconf has no preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let cores = if online > 0 { online as usize } else { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) };
        if local_ranks > cores {
            Backoff::OVERSUBSCRIBED
        } else {
            Backoff::DEDICATED
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::DEDICATED
    }
}

/// Where a wait stands in its backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Busy-poll (lowest latency).
    Spin,
    /// Give the core away between polls (oversubscribed hosts).
    Yield,
    /// Sleep or block in the kernel between polls.
    Block,
}

/// One bounded wait. Create it when a wait starts; call [`Waiter::pause`] each time a poll found
/// nothing to do.
pub struct Waiter {
    rounds: u32,
    start: Option<Instant>,
    elapsed: Duration,
    timeout: Duration,
    backoff: Backoff,
    /// When (in elapsed time) the thread's interrupt check runs next.
    next_check: Duration,
}

impl Waiter {
    /// A wait bounded by `timeout`. Creating one costs nothing (the clock starts at the first
    /// pause).
    #[inline]
    pub fn new(timeout: Duration, backoff: Backoff) -> Self {
        Waiter { rounds: 0, start: None, elapsed: Duration::ZERO, timeout, backoff, next_check: INTERRUPT_CHECK_PERIOD }
    }

    /// The current backoff phase.
    #[inline]
    pub fn phase(&self) -> Phase {
        if self.elapsed < self.backoff.spin {
            Phase::Spin
        } else if self.elapsed < self.backoff.spin + self.backoff.yield_for {
            Phase::Yield
        } else {
            Phase::Block
        }
    }

    /// Time left before the timeout (for kernel blocking calls).
    pub fn remaining(&self) -> Duration {
        self.timeout.saturating_sub(self.elapsed)
    }

    /// Checks the abort flag and the clock, then backs off once. `what` names the operation for
    /// the error message and is only called on failure. In [`Phase::Block`] it sleeps briefly
    /// unless `blocked_elsewhere` says the caller already blocked in the kernel.
    #[inline]
    pub fn pause(&mut self, abort: &AbortState, rank: usize, what: &dyn Fn() -> String, blocked_elsewhere: bool) -> Result<()> {
        if abort.is_set() {
            abort.check(rank, &what())?;
        }
        self.rounds = self.rounds.wrapping_add(1);
        if self.phase() == Phase::Spin && !self.rounds.is_multiple_of(32) {
            // Reading the clock costs more than a spin round on some virtual machines, and a
            // peer arriving while we read it waits for us: the first 31 rounds only spin (the
            // timeout then counts from round 32, a fraction of a microsecond late).
            std::hint::spin_loop();
            return Ok(());
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        self.elapsed = start.elapsed();
        if self.elapsed >= self.timeout {
            return Err(Error::Timeout { rank, op: what(), after: self.elapsed });
        }
        if self.elapsed >= self.next_check {
            // Only long waits get here (once per period), so the fast path pays nothing.
            self.next_check = self.elapsed + INTERRUPT_CHECK_PERIOD;
            run_interrupt_check();
            if abort.is_set() {
                abort.check(rank, &what())?;
            }
        }
        match self.phase() {
            Phase::Spin => std::hint::spin_loop(),
            Phase::Yield => std::thread::yield_now(),
            Phase::Block => {
                if !blocked_elsewhere {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::AbortInfo;

    /// Pauses until the waiter gives up; returns how many pauses that took and the error.
    fn pause_until_error(w: &mut Waiter, abort: &AbortState) -> (usize, Error) {
        for i in 1..=10_000 {
            if let Err(e) = w.pause(abort, 3, &|| "a test wait".into(), true) {
                return (i, e);
            }
        }
        panic!("the waiter never gave up");
    }

    #[test]
    fn a_spinning_wait_times_out_within_one_clock_period() {
        let abort = AbortState::new();
        let mut w = Waiter::new(Duration::ZERO, Backoff::DEDICATED);
        let (pauses, e) = pause_until_error(&mut w, &abort);
        assert!(pauses <= 32, "the clock is read at least every 32 pauses, took {pauses}");
        assert!(matches!(e, Error::Timeout { rank: 3, .. }), "{e:?}");
        assert!(e.to_string().contains("a test wait"), "{e}");
    }

    #[test]
    fn an_oversubscribed_wait_times_out_at_once() {
        let abort = AbortState::new();
        let mut w = Waiter::new(Duration::ZERO, Backoff::OVERSUBSCRIBED);
        assert_eq!(pause_until_error(&mut w, &abort).0, 1, "no spin phase: the first pause reads the clock");
    }

    #[test]
    fn an_abort_ends_the_wait_on_the_next_pause() {
        let abort = AbortState::new();
        let mut w = Waiter::new(Duration::from_secs(3600), Backoff::DEDICATED);
        w.pause(&abort, 3, &|| "a test wait".into(), true).expect("no abort yet");
        abort.raise(AbortInfo { lost_rank: Some(1), reason: "lost peer rank 1 during a test".into() });
        let (pauses, e) = pause_until_error(&mut w, &abort);
        assert_eq!(pauses, 1);
        assert!(!matches!(e, Error::Timeout { .. }), "{e:?}");
    }

    /// Pauses (sleeping in the block phase) until the waiter gives up; the error.
    fn sleep_until_error(w: &mut Waiter, abort: &AbortState) -> Error {
        loop {
            if let Err(e) = w.pause(abort, 3, &|| "a test wait".into(), false) {
                return e;
            }
        }
    }

    #[test]
    fn an_interrupt_check_runs_in_long_waits_and_its_abort_ends_them() {
        let abort = AbortState::new();
        let calls = Cell::new(0u32);
        let check = || {
            calls.set(calls.get() + 1);
            if calls.get() == 2 {
                abort.raise(AbortInfo { lost_rank: None, reason: "rank 3 was interrupted".into() });
            }
        };
        let e =
            with_interrupt_check(&check, || sleep_until_error(&mut Waiter::new(Duration::from_secs(5), Backoff::OVERSUBSCRIBED), &abort));
        assert_eq!(calls.get(), 2, "the check ran once per period until it raised the abort");
        assert!(matches!(&e, Error::Aborted { rank: 3, reason } if reason.contains("interrupted")), "{e:?}");
        // Uninstalled on return: a later long wait on this thread never runs it.
        let e = sleep_until_error(&mut Waiter::new(INTERRUPT_CHECK_PERIOD * 3, Backoff::OVERSUBSCRIBED), &AbortState::new());
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn a_short_wait_never_runs_the_interrupt_check() {
        let abort = AbortState::new();
        let calls = Cell::new(0u32);
        let check = || calls.set(calls.get() + 1);
        with_interrupt_check(&check, || {
            let e = sleep_until_error(&mut Waiter::new(INTERRUPT_CHECK_PERIOD / 2, Backoff::OVERSUBSCRIBED), &abort);
            assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        });
        assert_eq!(calls.get(), 0);
    }
}
