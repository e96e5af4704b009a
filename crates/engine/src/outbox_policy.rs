//! The outbox policy: one set of rules for every outbox Kizuna delivers, the browser client's
//! (`Engine`) and universe sync's source outbox (`universe.rs`, driven by `kizuna-server
//! universe-sync`). Plain functions of their inputs: no clock, no store, no network.
//!
//! What it decides:
//! * **Order**: which delivery units go in the next request ([`RetryPolicy::unit_state`],
//!   [`next_slice`]). Units go in issue order; one backing off blocks everything behind it; one
//!   held by its delay window does not.
//! * **Attempt accounting and dead letters**: whether a failed request is charged to the budget of
//!   what it carried ([`RetryPolicy::on_request_failure`]), the backoff `retry_at` after a failure
//!   ([`RetryPolicy::backoff_until`]) and the move to the dead letters when the budget is spent
//!   ([`RetryPolicy::charge`]).
//! * **Verdicts**: what each answer means for an entry ([`judge`]); a `DELAYED` answer refunds
//!   the attempt and holds the entry until its time ([`RetryPolicy::delayed_until`]).
//!
//! Where the two outboxes differ, the rule is a parameter:
//!
//! | | browser client | universe sync |
//! |---|---|---|
//! | [`Charge`]: which failures cost an attempt | only permanent refusals (a write the server never refused is never given up on) | every failure: a target that cannot be reached or that fails costs an attempt (the seed's rule) |
//! | budget of a permanent refusal of a lone unit | `max_permanent_failures` (5) | 1: the target refused this very event |
//! | [`DelayWindow`]: an entry whose `apply_after` is ahead | held locally until then | sent: the target's clock judges, `DELAYED` then holds it |

use kizuna_protocol::{ErrorClass, Reason, Verdict, VerdictStatus};

use crate::backoff;
use crate::prng::Prng;
use crate::records::Millis;

/// Which failed requests cost the entries they carried an attempt of their budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Only permanent refusals (4xx the server will repeat); retryable failures back off free.
    PermanentOnly,
    /// Every failure, retryable ones included.
    EveryFailure,
}

/// What a future `apply_after` means before the first send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayWindow {
    /// The entry is not sent before its time (by this side's clock).
    HoldLocally,
    /// The entry is sent at once and the receiver's clock judges; a `DELAYED` answer then holds it
    /// until `max(apply_after, now + retry_base)`.
    ReceiverJudges,
}

/// The parameters of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First backoff step; also the least wait after a `DELAYED` answer.
    pub retry_base_ms: Millis,
    /// Backoff cap.
    pub retry_max_ms: Millis,
    /// Which failures are charged.
    pub charge: Charge,
    /// Budget a permanent refusal of a unit sent alone may use up before it is dead-lettered.
    pub permanent_budget: u32,
    /// Delay windows before the first send.
    pub delay_window: DelayWindow,
}

/// The timing of one entry of a delivery unit, as [`RetryPolicy::unit_state`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The entry's delay window, if any.
    pub apply_after: Option<Millis>,
    /// Not sent again before this time, if set.
    pub retry_at: Option<Millis>,
    /// `retry_at` is a backoff after a failure, not the wait a `DELAYED` answer set: it blocks what
    /// comes after the entry, delay window or not.
    pub failed: bool,
}

/// Where a delivery unit stands at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitState {
    /// Can go in the next request.
    Ready,
    /// In its delay window until then; does not block the queue.
    Held(Millis),
    /// Backing off until then; blocks the queue behind it.
    Blocked(Millis),
}

/// What to do after a whole request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Every entry of the request backs off; nothing is charged.
    BackOff,
    /// Every unit of the request is charged one attempt (see [`RetryPolicy::charge`]).
    Charge {
        /// The budget a charged unit may use (`None`: each entry's own, e.g. its `max_attempts`).
        budget: Option<u32>,
    },
    /// A permanent refusal of several units names no culprit: resend at once in slices this wide,
    /// nothing charged, until the culprit goes alone.
    Narrow {
        /// The new slice width.
        width: usize,
    },
}

/// After a unit was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charged {
    /// Budget left: not sent again before this time.
    RetryAt(Millis),
    /// Budget spent: move it to the dead letters.
    DeadLetter,
}

/// What one verdict means for the entry it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// `APPLIED` or `SKIPPED` (a `replayed` verdict like a first one): the receiver holds the write.
    Acknowledged {
        /// `SKIPPED`: seen before, its verdict pruned.
        skipped: bool,
    },
    /// `REJECTED` with its reason: the receiver refused the write and will say so again.
    Refused(Reason),
    /// `DELAYED`: judged early; not a failed attempt.
    Delayed,
    /// No verdict, or a refusal without a reason: not an answer to act on.
    Unusable,
}

/// The verdict of the mutation `id`, judged.
pub fn judge(verdict: Option<&Verdict>) -> Judged {
    match verdict.map(|v| (v.status, v.reason)) {
        Some((VerdictStatus::Applied, _)) => Judged::Acknowledged { skipped: false },
        Some((VerdictStatus::Skipped, _)) => Judged::Acknowledged { skipped: true },
        Some((VerdictStatus::Rejected, Some(reason))) => Judged::Refused(reason),
        Some((VerdictStatus::Delayed, _)) => Judged::Delayed,
        _ => Judged::Unusable,
    }
}

/// Units for the next request, as positions in `units` (issue order): ready units up to `limit`
/// entries (at least one unit, so a unit wider than the limit still goes whole), skipping held
/// units and stopping at the first blocked one. `units` gives each unit's width and state.
pub fn next_slice(units: impl IntoIterator<Item = (usize, UnitState)>, limit: usize) -> Vec<usize> {
    let limit = limit.max(1);
    let mut slice = Vec::new();
    let mut width = 0;
    for (i, (unit_width, state)) in units.into_iter().enumerate() {
        match state {
            UnitState::Held(_) => continue,
            UnitState::Blocked(_) => break,
            UnitState::Ready => {
                if !slice.is_empty() && width + unit_width > limit {
                    break;
                }
                width += unit_width;
                slice.push(i);
                if width >= limit {
                    break;
                }
            }
        }
    }
    slice
}

/// The earliest time a unit can go: now for a ready one, a held one's window end, the first
/// blocked one's retry time (which hides everything behind it). `None`: nothing waits.
pub fn next_send_at(units: impl IntoIterator<Item = UnitState>, now: Millis) -> Option<Millis> {
    let mut earliest: Option<Millis> = None;
    for state in units {
        let at = match state {
            UnitState::Ready => now,
            UnitState::Held(until) => until,
            UnitState::Blocked(until) => {
                earliest = Some(earliest.map_or(until, |e| e.min(until)));
                break;
            }
        };
        earliest = Some(earliest.map_or(at, |e| e.min(at)));
        if at == now {
            break;
        }
    }
    earliest
}

impl RetryPolicy {
    /// Where a unit made of entries with these timings stands at `now`.
    pub fn unit_state(&self, entries: impl IntoIterator<Item = Timing>, now: Millis) -> UnitState {
        let mut held = None::<Millis>;
        let mut blocked = None::<Millis>;
        for e in entries {
            // A backoff after a failure blocks (issue order: a later write of the key must not go
            // first), with a delay window too: read as part of the window, it held the entry alone
            // and let everything behind it go, window after window.
            let (hold, block) = match (e.apply_after, e.failed) {
                (None, _) => (None, e.retry_at),
                (Some(after), false) => match self.delay_window {
                    DelayWindow::HoldLocally => (Some(after.max(e.retry_at.unwrap_or(Millis::MIN))), None),
                    DelayWindow::ReceiverJudges => (e.retry_at, None),
                },
                (Some(after), true) => match self.delay_window {
                    DelayWindow::HoldLocally => (Some(after), e.retry_at),
                    DelayWindow::ReceiverJudges => (None, e.retry_at),
                },
            };
            if let Some(until) = hold.filter(|&until| until > now) {
                held = Some(held.map_or(until, |h| h.max(until)));
            }
            if let Some(at) = block.filter(|&at| at > now) {
                blocked = Some(blocked.map_or(at, |b| b.max(at)));
            }
        }
        match (held, blocked) {
            (Some(h), _) => UnitState::Held(h),
            (None, Some(b)) => UnitState::Blocked(b),
            (None, None) => UnitState::Ready,
        }
    }

    /// What a request that failed as a whole leads to, for a request of `units` delivery units
    /// and `width` entries in all, refused with `code` and classified `class`.
    pub fn on_request_failure(&self, class: ErrorClass, code: &str, units: usize, width: usize) -> OnFailure {
        if class.is_retryable() {
            return match self.charge {
                Charge::PermanentOnly => OnFailure::BackOff,
                Charge::EveryFailure => OnFailure::Charge { budget: None },
            };
        }
        if units <= 1 {
            return OnFailure::Charge { budget: Some(self.permanent_budget) };
        }
        let width = if ErrorClass::is_size_refusal(code) { (width / 2).max(1) } else { 1 };
        OnFailure::Narrow { width }
    }

    /// The backoff after the `failures`-th consecutive failure: now plus a jittered wait.
    pub fn backoff_until(&self, failures: u32, now: Millis, prng: &mut Prng) -> Millis {
        now.saturating_add(backoff::delay(failures.max(1), self.retry_base_ms, self.retry_max_ms, prng))
    }

    /// A unit was charged and has now used `used` of `budget`: it backs off, or is spent.
    pub fn charge(&self, used: u32, budget: u32, now: Millis, prng: &mut Prng) -> Charged {
        if used >= budget.max(1) {
            return Charged::DeadLetter;
        }
        Charged::RetryAt(self.backoff_until(used, now, prng))
    }

    /// Entries that failed together (one request) are charged together: each `(used, budget)` is
    /// spent or not on its own, and those with budget left share one backoff, drawn for the most
    /// used of them, so that they go out again together, in the order they were sent.
    pub fn charge_together(&self, charges: &[(u32, u32)], now: Millis, prng: &mut Prng) -> Vec<Charged> {
        let spent = |&(used, budget): &(u32, u32)| used >= budget.max(1);
        let most_used = charges.iter().filter(|c| !spent(c)).map(|&(used, _)| used).max();
        let retry_at = most_used.map(|used| self.backoff_until(used, now, prng));
        charges
            .iter()
            .map(|c| match (spent(c), retry_at) {
                (false, Some(at)) => Charged::RetryAt(at),
                _ => Charged::DeadLetter,
            })
            .collect()
    }

    /// After a `DELAYED` answer: the entry is not sent again before this time. The attempt is
    /// refunded and the budget's count of consecutive failures restarts (the receiver answered).
    pub fn delayed_until(&self, apply_after: Option<Millis>, now: Millis) -> Millis {
        apply_after.unwrap_or(Millis::MIN).max(now.saturating_add(self.retry_base_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(charge: Charge, delay_window: DelayWindow) -> RetryPolicy {
        RetryPolicy { retry_base_ms: 1000, retry_max_ms: 60_000, charge, permanent_budget: 5, delay_window }
    }

    #[test]
    fn retryable_failures_are_charged_only_where_every_failure_costs() {
        let browser = policy(Charge::PermanentOnly, DelayWindow::HoldLocally);
        let universe = policy(Charge::EveryFailure, DelayWindow::ReceiverJudges);
        assert_eq!(browser.on_request_failure(ErrorClass::Retryable, "NETWORK", 3, 3), OnFailure::BackOff);
        assert_eq!(universe.on_request_failure(ErrorClass::Retryable, "NETWORK", 3, 3), OnFailure::Charge { budget: None });
        for p in [browser, universe] {
            assert_eq!(p.on_request_failure(ErrorClass::Permanent, "KZP04", 1, 1), OnFailure::Charge { budget: Some(5) });
            assert_eq!(p.on_request_failure(ErrorClass::Permanent, "KZP02", 4, 10), OnFailure::Narrow { width: 5 });
            assert_eq!(p.on_request_failure(ErrorClass::Permanent, "KZP04", 4, 10), OnFailure::Narrow { width: 1 });
        }
    }

    /// Times near the end of the clock wait until its end: the sums saturate instead of overflowing
    /// (a debug build panicked; a release build wrapped to a time long past, due at once).
    #[test]
    fn times_at_the_end_of_the_clock_saturate() {
        let p = policy(Charge::PermanentOnly, DelayWindow::HoldLocally);
        let mut prng = Prng::new(7);
        assert_eq!(p.backoff_until(3, Millis::MAX - 10, &mut prng), Millis::MAX);
        assert_eq!(p.delayed_until(None, Millis::MAX - 10), Millis::MAX);
    }

    #[test]
    fn a_charge_backs_off_until_the_budget_is_spent() {
        let p = policy(Charge::EveryFailure, DelayWindow::ReceiverJudges);
        let mut prng = Prng::new(7);
        let Charged::RetryAt(at) = p.charge(1, 3, 10_000, &mut prng) else { panic!("budget left") };
        assert!((10_500..=11_000).contains(&at), "{at}");
        let Charged::RetryAt(at) = p.charge(2, 3, 10_000, &mut prng) else { panic!("budget left") };
        assert!((11_000..=12_000).contains(&at), "{at}");
        assert_eq!(p.charge(3, 3, 10_000, &mut prng), Charged::DeadLetter);
        let together = p.charge_together(&[(1, 3), (3, 3), (2, 3)], 10_000, &mut prng);
        assert_eq!(together[1], Charged::DeadLetter);
        assert_eq!(together[0], together[2], "one backoff for what failed together");
        assert!(matches!(together[2], Charged::RetryAt(at) if (11_000..=12_000).contains(&at)), "{together:?}");
    }

    #[test]
    fn delay_windows_hold_locally_or_after_a_delayed_answer() {
        let now = 5_000;
        let early = Timing { apply_after: Some(9_000), retry_at: None, failed: false };
        let answered = Timing { apply_after: Some(9_000), retry_at: Some(9_000), failed: false };
        let backing_off = Timing { apply_after: None, retry_at: Some(7_000), failed: true };
        // Due (its window passed), then a failure: its backoff blocks what is behind it.
        let due_then_failed = Timing { apply_after: Some(1_000), retry_at: Some(7_000), failed: true };
        let browser = policy(Charge::PermanentOnly, DelayWindow::HoldLocally);
        let universe = policy(Charge::EveryFailure, DelayWindow::ReceiverJudges);
        assert_eq!(browser.unit_state([early], now), UnitState::Held(9_000));
        assert_eq!(universe.unit_state([early], now), UnitState::Ready, "the receiver judges");
        assert_eq!(universe.unit_state([answered], now), UnitState::Held(9_000));
        assert_eq!(universe.unit_state([answered], 9_000), UnitState::Ready);
        assert_eq!(universe.unit_state([backing_off], now), UnitState::Blocked(7_000));
        assert_eq!(universe.unit_state([due_then_failed], now), UnitState::Blocked(7_000));
        assert_eq!(browser.unit_state([due_then_failed], now), UnitState::Blocked(7_000));
        let early_then_failed = Timing { apply_after: Some(9_000), ..due_then_failed };
        assert_eq!(browser.unit_state([early_then_failed], now), UnitState::Held(9_000), "its window holds it first");
        assert_eq!(universe.delayed_until(Some(9_000), now), 9_000);
        assert_eq!(universe.delayed_until(Some(5_100), now), 6_000, "at least retry_base after now");
    }

    #[test]
    fn slices_keep_issue_order_skip_held_units_and_stop_at_a_blocked_one() {
        use UnitState::*;
        assert_eq!(next_slice([(1, Ready), (1, Held(9)), (1, Ready), (1, Blocked(9)), (1, Ready)], 10), vec![0, 2]);
        assert_eq!(next_slice([(1, Ready), (1, Ready), (1, Ready)], 2), vec![0, 1]);
        assert_eq!(next_slice([(3, Ready), (1, Ready)], 2), vec![0], "a wide unit still goes whole");
        assert_eq!(next_send_at([Held(50), Blocked(30), Ready], 10), Some(30));
        assert_eq!(next_send_at([Held(50), Ready], 10), Some(10));
        assert_eq!(next_send_at([], 10), None);
    }
}
