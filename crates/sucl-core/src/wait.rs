//! Bounded waiting: spin, then yield, then sleep or block, never past the timeout, and never
//! past an abort raised by another rank.

use crate::error::{AbortState, Error, Result};
use std::time::{Duration, Instant};

const SPIN_ROUNDS: u32 = 4000;
const YIELD_ROUNDS: u32 = 2000;

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
    start: Option<Instant>,
    rounds: u32,
    timeout: Duration,
}

impl Waiter {
    /// A wait bounded by `timeout`. Creating one costs nothing (no clock read).
    #[inline]
    pub fn new(timeout: Duration) -> Self {
        Waiter { start: None, rounds: 0, timeout }
    }

    /// The current backoff phase.
    #[inline]
    pub fn phase(&self) -> Phase {
        if self.rounds < SPIN_ROUNDS {
            Phase::Spin
        } else if self.rounds < SPIN_ROUNDS + YIELD_ROUNDS {
            Phase::Yield
        } else {
            Phase::Block
        }
    }

    /// Time left before the timeout (for kernel blocking calls).
    pub fn remaining(&self) -> Duration {
        match self.start {
            Some(s) => self.timeout.saturating_sub(s.elapsed()),
            None => self.timeout,
        }
    }

    /// Checks the abort flag and the clock, then backs off once. `what` names the operation for
    /// the error message and is only called on failure. In [`Phase::Block`] it sleeps briefly
    /// unless `blocked_elsewhere` says the caller already blocked in the kernel.
    #[inline]
    pub fn pause(
        &mut self,
        abort: &AbortState,
        rank: usize,
        what: &dyn Fn() -> String,
        blocked_elsewhere: bool,
    ) -> Result<()> {
        self.rounds = self.rounds.saturating_add(1);
        if abort.is_set() {
            abort.check(rank, &what())?;
        }
        match self.phase() {
            Phase::Spin => {
                std::hint::spin_loop();
                if self.rounds % 256 == 0 {
                    self.check_clock(rank, what)?;
                }
            }
            Phase::Yield => {
                std::thread::yield_now();
                self.check_clock(rank, what)?;
            }
            Phase::Block => {
                if !blocked_elsewhere {
                    std::thread::sleep(Duration::from_micros(50));
                }
                self.check_clock(rank, what)?;
            }
        }
        Ok(())
    }

    fn check_clock(&mut self, rank: usize, what: &dyn Fn() -> String) -> Result<()> {
        let start = *self.start.get_or_insert_with(Instant::now);
        let elapsed = start.elapsed();
        if elapsed >= self.timeout {
            return Err(Error::Timeout { rank, op: what(), after: elapsed });
        }
        Ok(())
    }
}
