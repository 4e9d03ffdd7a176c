//! Local events that mesh members wait for: which recording each member waits for, which have
//! completed, and when an event may be forgotten. Pure bookkeeping (the frames go out in `mesh`),
//! so that what a session keeps stays bounded by what is live, not by how many events it made.
//!
//! A member subscribes once per [`Command::WaitRemote`](crate::wire::Command::WaitRemote) it
//! runs. The client counts those it posted for an event and says how many when it releases the
//! event ([`Command::ReleaseEvents`](crate::wire::Command::ReleaseEvents)); once that many came and
//! the event is complete, nothing more will ask for it, and it is forgotten. A subscription sent
//! again after a lost link may still come later: the last [`FORGOTTEN_KEPT`] forgotten events
//! keep their outcome for it.

use std::collections::{HashMap, VecDeque};

/// How many forgotten events keep their outcome, for subscriptions sent again after a link
/// broke (each holds 16 bytes).
pub(super) const FORGOTTEN_KEPT: usize = 4096;

/// What is known of one local event.
#[derive(Default)]
struct Local {
    /// How many times it was recorded (ids may be recorded again; each recording is waited
    /// for apart).
    recording: u64,
    /// The latest recording completed (`Some(true)`) or failed (`Some(false)`).
    done: Option<bool>,
    /// Members waiting, each for the recording it subscribed to.
    waiting: Vec<(u32, u64)>,
    /// Subscriptions received.
    subscriptions: u64,
    /// Released by the client, which posted this many waits for it.
    released: Option<u64>,
}

/// The session's local events that members may wait for.
#[derive(Default)]
pub(super) struct Waiters {
    events: HashMap<u64, Local>,
    forgotten: VecDeque<(u64, bool)>,
}

/// What a subscription gets.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Subscribed {
    /// The event's outcome, to send now.
    Now(bool),
    /// A notice follows once the recording ends.
    Later,
}

impl Waiters {
    /// A new recording of `event` starts; returns its number. Members subscribing from now on
    /// wait for it; those waiting for an earlier one still get that one's notice.
    pub(super) fn recorded(&mut self, event: u64) -> u64 {
        self.forgotten.retain(|(e, _)| *e != event);
        let l = self.events.entry(event).or_default();
        l.recording += 1;
        l.done = None;
        l.recording
    }

    /// Recording `recording` of `event` completed (`ok`) or failed: returns the members to tell.
    pub(super) fn completed(&mut self, event: u64, recording: u64, ok: bool) -> Vec<u32> {
        let Some(l) = self.events.get_mut(&event) else { return Vec::new() };
        if l.recording == recording {
            l.done = Some(ok);
        }
        let mut tell = Vec::new();
        l.waiting.retain(|(member, r)| {
            let due = *r == recording;
            if due {
                tell.push(*member);
            }
            !due
        });
        self.forget_if_over(event);
        tell
    }

    /// Member `from` asks for `event`: the latest recording's outcome, or a notice later (for
    /// an event not recorded yet, of its first recording).
    pub(super) fn subscribe(&mut self, event: u64, from: u32) -> Subscribed {
        if !self.events.contains_key(&event) {
            if let Some((_, ok)) = self.forgotten.iter().find(|(e, _)| *e == event) {
                return Subscribed::Now(*ok);
            }
        }
        let l = self.events.entry(event).or_default();
        l.subscriptions += 1;
        let answer = match l.done {
            Some(ok) => Subscribed::Now(ok),
            None => {
                l.waiting.push((from, l.recording.max(1)));
                Subscribed::Later
            }
        };
        self.forget_if_over(event);
        answer
    }

    /// The client released `event` after posting `waits` waits for it. An event that was
    /// never recorded (its Record was refused) fails those waiting for it: returns them.
    pub(super) fn released(&mut self, event: u64, waits: u64) -> Vec<u32> {
        let l = self.events.entry(event).or_default();
        l.released = Some(waits);
        let mut tell = Vec::new();
        if l.recording == 0 {
            l.done = Some(false);
            tell = l.waiting.drain(..).map(|(m, _)| m).collect();
        }
        self.forget_if_over(event);
        tell
    }

    fn forget_if_over(&mut self, event: u64) {
        let over = self
            .events
            .get(&event)
            .is_some_and(|l| l.released.is_some_and(|w| l.subscriptions >= w) && l.done.is_some() && l.waiting.is_empty());
        if over {
            let ok = self.events.remove(&event).and_then(|l| l.done).unwrap_or(false);
            if self.forgotten.len() == FORGOTTEN_KEPT {
                self.forgotten.pop_front();
            }
            self.forgotten.push_back((event, ok));
        }
    }

    /// Events still kept (not forgotten).
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_waiting_for_a_recording_is_told_of_that_one_not_of_a_later_one() {
        let mut w = Waiters::default();
        let r1 = w.recorded(7);
        assert_eq!(w.subscribe(7, 1), Subscribed::Later);
        // Recorded again (behind nothing: complete at once) while the first still runs.
        let r2 = w.recorded(7);
        assert!(w.completed(7, r2, true).is_empty(), "member 1 waits for the first recording");
        assert_eq!(w.completed(7, r1, true), vec![1]);
    }

    #[test]
    fn a_late_subscriber_gets_the_outcome_at_once_and_a_failure_stays_a_failure() {
        let mut w = Waiters::default();
        let r = w.recorded(3);
        assert!(w.completed(3, r, false).is_empty());
        assert_eq!(w.subscribe(3, 2), Subscribed::Now(false));
    }

    #[test]
    fn a_subscription_before_the_record_waits_for_the_first_recording() {
        let mut w = Waiters::default();
        assert_eq!(w.subscribe(5, 1), Subscribed::Later);
        let r = w.recorded(5);
        assert_eq!(w.completed(5, r, true), vec![1]);
    }

    #[test]
    fn an_event_is_forgotten_once_released_complete_and_every_wait_came() {
        let mut w = Waiters::default();
        let r = w.recorded(9);
        assert_eq!(w.subscribe(9, 1), Subscribed::Later);
        assert!(w.released(9, 2).is_empty());
        assert_eq!(w.completed(9, r, true), vec![1]);
        assert_eq!(w.kept(), 1, "one of the two waits has not subscribed yet");
        assert_eq!(w.subscribe(9, 2), Subscribed::Now(true));
        assert_eq!(w.kept(), 0);
        // A subscription sent again after a lost link still gets the outcome.
        assert_eq!(w.subscribe(9, 1), Subscribed::Now(true));
        assert_eq!(w.kept(), 0);
    }

    #[test]
    fn many_released_events_keep_nothing_but_the_bounded_outcomes() {
        let mut w = Waiters::default();
        for e in 0..3 * FORGOTTEN_KEPT as u64 {
            let r = w.recorded(e);
            w.subscribe(e, 1);
            w.completed(e, r, true);
            w.released(e, 1);
        }
        assert_eq!(w.kept(), 0);
        assert_eq!(w.forgotten.len(), FORGOTTEN_KEPT);
    }

    #[test]
    fn a_released_event_never_recorded_fails_its_waiters() {
        let mut w = Waiters::default();
        assert_eq!(w.subscribe(4, 3), Subscribed::Later);
        assert_eq!(w.released(4, 1), vec![3]);
        assert_eq!(w.kept(), 0);
    }
}
