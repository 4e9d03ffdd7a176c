//! Bounded waiting: spin, then yield, then sleep or block, never past the timeout, and never
//! past an abort raised by another rank.

use crate::error::{AbortState, Error, Result};
use std::time::{Duration, Instant};

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
}

impl Waiter {
    /// A wait bounded by `timeout`. Creating one costs nothing (the clock starts at the first
    /// pause).
    #[inline]
    pub fn new(timeout: Duration, backoff: Backoff) -> Self {
        Waiter { rounds: 0, start: None, elapsed: Duration::ZERO, timeout, backoff }
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
}
