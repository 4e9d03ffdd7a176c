//! Local events that mesh members wait for: which recording each member's wait is for, which
//! have completed, and when an event may be forgotten. Pure bookkeeping (the frames go out in
//! `mesh`), so that what a session keeps stays bounded by what is live, not by how many events
//! it made. Only sessions in a mesh keep any.
//!
//! A member subscribes once per [`Command::WaitRemote`](crate::wire::Command::WaitRemote) it
//! runs, naming that wait (a subscription sent again after a broken link names the same one).
//! The client counts the waits it posted for an event and says how many when it releases the
//! event ([`Command::ReleaseEvents`](crate::wire::Command::ReleaseEvents)); once that many
//! waits have subscribed and the event is complete, nothing more will ask for it, and it is
//! forgotten. Two bounds hold what a client could otherwise grow: at most [`LINGERING`]
//! released, complete events wait for subscriptions (a wait that failed before subscribing
//! never comes; the oldest are forgotten first), and the last [`FORGOTTEN_KEPT`] forgotten
//! events keep their outcome, for subscriptions that come late anyway.

use std::collections::{HashMap, HashSet, VecDeque};

/// How many forgotten events keep their outcome (each about 40 bytes).
pub(super) const FORGOTTEN_KEPT: usize = 4096;
/// How many released events may wait for subscriptions that the client said would come.
pub(super) const LINGERING: usize = 4096;

/// What is known of one local event.
#[derive(Default)]
struct Local {
    /// How many times it was recorded (a raw client may record an id again; each recording is
    /// waited for apart).
    recording: u64,
    /// The latest recording completed (`Some(true)`) or failed (`Some(false)`).
    done: Option<bool>,
    /// Waits not yet told: (member, its wait, the recording it waits for).
    waiting: Vec<(u32, u64, u64)>,
    /// The waits that subscribed, by member and wait.
    subscribed: HashSet<(u32, u64)>,
    /// Released by the client, which posted this many waits for it.
    released: Option<u64>,
}

/// The session's local events that members may wait for.
#[derive(Default)]
pub(super) struct Waiters {
    events: HashMap<u64, Local>,
    /// Released events, oldest first (ids already forgotten are skipped when they come up).
    released: VecDeque<u64>,
    /// Outcomes of forgotten events, with the order they were forgotten in (a number, so that
    /// an id forgotten twice drops only its own older entry).
    forgotten: HashMap<u64, (u64, bool)>,
    forgotten_order: VecDeque<(u64, u64)>,
    forgotten_count: u64,
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
    /// A new recording of `event` starts; returns its number. Waits subscribing from now on
    /// are for it; those waiting for an earlier one still get that one's notice.
    pub(super) fn recorded(&mut self, event: u64) -> u64 {
        self.forgotten.remove(&event);
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
        l.waiting.retain(|(member, _, r)| {
            let due = *r == recording;
            if due {
                tell.push(*member);
            }
            !due
        });
        self.forget_if_over(event);
        tell
    }

    /// Wait `wait` of member `from` asks for `event`: the latest recording's outcome, or a
    /// notice later (for an event not recorded yet, of its first recording). A wait that
    /// subscribed before is not counted again, and is told once.
    pub(super) fn subscribe(&mut self, event: u64, from: u32, wait: u64) -> Subscribed {
        if !self.events.contains_key(&event) {
            if let Some((_, ok)) = self.forgotten.get(&event) {
                return Subscribed::Now(*ok);
            }
        }
        let l = self.events.entry(event).or_default();
        let again = !l.subscribed.insert((from, wait));
        let answer = match l.done {
            Some(ok) => Subscribed::Now(ok),
            None if again && l.waiting.iter().any(|(m, w, _)| (*m, *w) == (from, wait)) => Subscribed::Later,
            None => {
                l.waiting.push((from, wait, l.recording.max(1)));
                Subscribed::Later
            }
        };
        self.forget_if_over(event);
        answer
    }

    /// The client released `event` after posting `waits` waits for it. An event that was
    /// never recorded here (its Record was refused) fails the waits for it: returns their members.
    pub(super) fn released(&mut self, event: u64, waits: u64) -> Vec<u32> {
        let Some(l) = self.events.get_mut(&event) else {
            self.remember(event, false);
            return Vec::new();
        };
        l.released = Some(waits);
        let mut tell = Vec::new();
        if l.recording == 0 {
            l.done = Some(false);
            tell = l.waiting.drain(..).map(|(m, _, _)| m).collect();
        }
        self.released.push_back(event);
        self.forget_if_over(event);
        self.forget_lingering();
        tell
    }

    fn forget_if_over(&mut self, event: u64) {
        let over = self
            .events
            .get(&event)
            .is_some_and(|l| l.released.is_some_and(|w| l.subscribed.len() as u64 >= w) && l.done.is_some() && l.waiting.is_empty());
        if over {
            self.forget(event);
        }
    }

    /// Past [`LINGERING`] released events, forgets the oldest that are complete and told.
    fn forget_lingering(&mut self) {
        let mut looked = 0;
        while self.released.len() > LINGERING && looked < self.released.len() {
            let Some(e) = self.released.pop_front() else { break };
            match self.events.get(&e) {
                Some(l) if l.released.is_some() && l.done.is_some() && l.waiting.is_empty() => self.forget(e),
                Some(l) if l.released.is_some() => {
                    looked += 1;
                    self.released.push_back(e); // still running or told later: not yet
                }
                _ => {} // forgotten already
            }
        }
    }

    fn forget(&mut self, event: u64) {
        if let Some(l) = self.events.remove(&event) {
            self.remember(event, l.done.unwrap_or(false));
        }
    }

    fn remember(&mut self, event: u64, ok: bool) {
        self.forgotten_count += 1;
        self.forgotten.insert(event, (self.forgotten_count, ok));
        self.forgotten_order.push_back((event, self.forgotten_count));
        while self.forgotten_order.len() > FORGOTTEN_KEPT {
            let Some((e, n)) = self.forgotten_order.pop_front() else { break };
            if self.forgotten.get(&e).is_some_and(|(m, _)| *m == n) {
                self.forgotten.remove(&e);
            }
        }
    }

    /// Events still kept (not forgotten), and forgotten outcomes kept.
    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        (self.events.len(), self.forgotten.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_waiting_for_a_recording_is_told_of_that_one_not_of_a_later_one() {
        let mut w = Waiters::default();
        let r1 = w.recorded(7);
        assert_eq!(w.subscribe(7, 1, 10), Subscribed::Later);
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
        assert_eq!(w.subscribe(3, 2, 1), Subscribed::Now(false));
    }

    #[test]
    fn a_subscription_before_the_record_waits_for_the_first_recording() {
        let mut w = Waiters::default();
        assert_eq!(w.subscribe(5, 1, 1), Subscribed::Later);
        let r = w.recorded(5);
        assert_eq!(w.completed(5, r, true), vec![1]);
    }

    #[test]
    fn an_event_is_forgotten_once_released_complete_and_every_wait_came() {
        let mut w = Waiters::default();
        let r = w.recorded(9);
        assert_eq!(w.subscribe(9, 1, 1), Subscribed::Later);
        assert!(w.released(9, 2).is_empty());
        assert_eq!(w.completed(9, r, true), vec![1]);
        assert_eq!(w.kept().0, 1, "one of the two waits has not subscribed yet");
        assert_eq!(w.subscribe(9, 2, 1), Subscribed::Now(true));
        assert_eq!(w.kept().0, 0);
        // A subscription that comes again later still gets the outcome.
        assert_eq!(w.subscribe(9, 1, 1), Subscribed::Now(true));
        assert_eq!(w.kept().0, 0);
    }

    #[test]
    fn a_subscription_sent_again_is_one_wait_told_once() {
        let mut w = Waiters::default();
        let r = w.recorded(4);
        assert_eq!(w.subscribe(4, 1, 7), Subscribed::Later);
        assert_eq!(w.subscribe(4, 1, 7), Subscribed::Later, "the same wait, after a broken link");
        assert!(w.released(4, 2).is_empty());
        assert_eq!(w.completed(4, r, true), vec![1], "told once");
        assert_eq!(w.kept().0, 1, "the second wait has not come");
        assert_eq!(w.subscribe(4, 1, 8), Subscribed::Now(true), "the member's second wait");
        assert_eq!(w.kept().0, 0);
    }

    #[test]
    fn many_released_events_keep_nothing_but_the_bounded_outcomes() {
        let mut w = Waiters::default();
        for e in 0..3 * FORGOTTEN_KEPT as u64 {
            let r = w.recorded(e);
            w.subscribe(e, 1, e);
            w.completed(e, r, true);
            w.released(e, 1);
        }
        assert_eq!(w.kept(), (0, FORGOTTEN_KEPT));
    }

    #[test]
    fn waits_that_never_subscribe_and_releases_of_unknown_events_stay_bounded() {
        let mut w = Waiters::default();
        for e in 0..3 * LINGERING as u64 {
            let r = w.recorded(e);
            w.completed(e, r, true);
            w.released(e, u64::MAX); // the waits failed before subscribing, or a client lies
            w.released(1 << 40 | e, u64::MAX); // never recorded
        }
        let (events, outcomes) = w.kept();
        assert!(events <= LINGERING + 1, "{events} events kept");
        assert_eq!(outcomes, FORGOTTEN_KEPT);
        assert!(w.released.len() <= LINGERING + 1);
    }

    #[test]
    fn a_released_event_never_recorded_fails_its_waiters() {
        let mut w = Waiters::default();
        assert_eq!(w.subscribe(4, 3, 1), Subscribed::Later);
        assert_eq!(w.released(4, 1), vec![3]);
        assert_eq!(w.kept().0, 0);
    }
}
