//! Universe sync, the policy half: which source-outbox events go to the target next, and what
//! each answer or failure does to them. Sans-IO like the rest of this crate: `kizuna-server
//! universe-sync` reads the events from the source database, sends the requests, and writes back
//! the [`Update`]s this returns, each in one source transaction.
//!
//! The rules are the browser client's outbox policy (`outbox_policy.rs`), with universe sync's
//! parameters (the seed's rules):
//! * events go in id order, one request at a time; an event backing off blocks those behind it,
//!   an event held by `apply_after` after a `DELAYED` answer does not;
//! * `APPLIED` and `SKIPPED` acknowledge; `DELAYED` leaves the event pending until
//!   `max(apply_after, now + retry_base)` and is not a failed attempt (the count of consecutive
//!   failed attempts restarts);
//! * a target that cannot be reached or that fails (any failed request, or an answer without a
//!   usable verdict) costs every event of the request an attempt and a backoff `retry_at`; at
//!   `max_attempts` the event is a dead letter;
//! * a delete the target answers `DELETE_WINS`, or `RLS_DENIED` with no row, found the row already
//!   gone: acknowledged (as skipped);
//! * a refusal is recorded on the event (`error`) and makes it a dead letter at once: a `REJECTED`
//!   verdict is recorded under the event's key, so sending the key again can only replay it; a
//!   permanent refusal of a request carrying that event alone (`KZP04`, a row too large) would be
//!   repeated too. A permanent refusal of several events narrows the request until the culprit
//!   goes alone, charging nothing.

use kizuna_protocol::{ErrorClass, PushResponse, Reason};
use uuid::Uuid;

use crate::inputs::Failure;
use crate::outbox_policy::{judge, next_send_at, next_slice, Charge, Charged, DelayWindow, Judged, OnFailure, RetryPolicy, Timing};
use crate::prng::Prng;
use crate::records::Millis;

/// One pending source-outbox event, as far as delivery is concerned (its payload stays in the
/// source database until it goes on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventState {
    /// The event id: monotonic, never reused; the mutation's `client_seq` on the target.
    pub id: i64,
    /// The event key: the mutation's `id`, its idempotency key on the target.
    pub key: Uuid,
    /// A delete (the row left the source, or its selection); otherwise an upsert of the row image.
    pub delete: bool,
    /// Not applied on the target before this time.
    pub apply_after: Option<Millis>,
    /// Consecutive failed delivery attempts.
    pub attempts: u32,
    /// The budget: at this many the event is a dead letter.
    pub max_attempts: u32,
    /// Not sent again before this time.
    pub retry_at: Option<Millis>,
    /// The last failure or refusal, as `CODE: message`.
    pub error: Option<String>,
}

/// What delivery did to one event; the adapter writes it to the source outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// The target holds the event (`APPLIED`, or `SKIPPED`: seen before, its verdict pruned).
    Acknowledged {
        /// The event id.
        id: i64,
        /// True for `SKIPPED`.
        skipped: bool,
    },
    /// Still pending, with new delivery state.
    Pending {
        /// The event id.
        id: i64,
        /// Consecutive failed attempts.
        attempts: u32,
        /// Not sent again before this time.
        retry_at: Option<Millis>,
        /// The last failure, if any.
        error: Option<String>,
    },
    /// Given up on: kept, never acknowledged, until an operator requeues or discards it.
    DeadLetter {
        /// The event id.
        id: i64,
        /// Failed attempts when it died.
        attempts: u32,
        /// Why, as `CODE: message`.
        error: String,
    },
}

/// Tunables of `universe-sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryConfig {
    /// Most events in one push request (keep it at or below the target's `max_batch_size`).
    pub max_slice: usize,
    /// First backoff step; also the least wait after a `DELAYED` answer.
    pub retry_base_ms: Millis,
    /// Backoff cap.
    pub retry_max_ms: Millis,
}

impl Default for DeliveryConfig {
    fn default() -> DeliveryConfig {
        DeliveryConfig { max_slice: 256, retry_base_ms: 1000, retry_max_ms: 300_000 }
    }
}

/// The delivery policy of one `universe-sync` process.
#[derive(Debug)]
pub struct Delivery {
    config: DeliveryConfig,
    /// The narrowed slice width while a permanent refusal is being isolated.
    slice_limit: Option<usize>,
    /// The last event of the request that was refused: once it is acknowledged, the refusal was
    /// isolated (or passed: a proxy's or firewall's passing 4xx) and slices are wide again. Without
    /// it one such refusal narrowed every request to one event for the life of the process.
    narrowed_through: Option<i64>,
    prng: Prng,
}

impl Delivery {
    /// `seed` feeds the backoff jitter.
    pub fn new(config: DeliveryConfig, seed: u64) -> Delivery {
        Delivery { config, slice_limit: None, narrowed_through: None, prng: Prng::new(seed) }
    }

    /// Universe sync's parameters of the shared outbox policy.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            retry_base_ms: self.config.retry_base_ms,
            retry_max_ms: self.config.retry_max_ms,
            charge: Charge::EveryFailure,
            permanent_budget: 1,
            delay_window: DelayWindow::ReceiverJudges,
        }
    }

    fn state(&self, event: &EventState, now: Millis) -> crate::outbox_policy::UnitState {
        let failed = event.error.is_some();
        self.policy().unit_state([Timing { apply_after: event.apply_after, retry_at: event.retry_at, failed }], now)
    }

    /// True when an event of `pending` backs off: nothing behind it may go before it.
    pub fn is_blocked(&self, pending: &[EventState], now: Millis) -> bool {
        pending.iter().any(|e| matches!(self.state(e, now), crate::outbox_policy::UnitState::Blocked(_)))
    }

    /// The ids of the events to send next, in order (`pending` in id order); empty when none is due.
    pub fn next_slice(&self, pending: &[EventState], now: Millis) -> Vec<i64> {
        let limit = self.slice_limit.unwrap_or(self.config.max_slice).clamp(1, self.config.max_slice.max(1));
        next_slice(pending.iter().map(|e| (1, self.state(e, now))), limit).into_iter().map(|i| pending[i].id).collect()
    }

    /// When an event of `pending` can go next (`None`: none waits).
    pub fn next_send_at(&self, pending: &[EventState], now: Millis) -> Option<Millis> {
        next_send_at(pending.iter().map(|e| self.state(e, now)), now)
    }

    /// The target answered the request that carried `sent`: one update per event.
    pub fn on_response(&mut self, sent: &[EventState], response: &PushResponse, now: Millis) -> Vec<Update> {
        let mut updates = Vec::with_capacity(sent.len());
        for event in sent {
            let verdict = response.verdicts.iter().find(|v| v.id == event.key);
            let update = match judge(verdict) {
                Judged::Acknowledged { skipped } => Update::Acknowledged { id: event.id, skipped },
                Judged::Refused(reason) if event.delete && already_gone(reason, verdict) => {
                    Update::Acknowledged { id: event.id, skipped: true }
                }
                Judged::Refused(reason) => {
                    let message = verdict.and_then(|v| v.message.clone()).unwrap_or_default();
                    self.slice_limit = None;
                    Update::DeadLetter { id: event.id, attempts: event.attempts, error: format!("REJECTED {}: {message}", reason.as_str()) }
                }
                Judged::Delayed => Update::Pending {
                    id: event.id,
                    attempts: 0,
                    retry_at: Some(self.policy().delayed_until(event.apply_after, now)),
                    error: None,
                },
                Judged::Unusable => {
                    let error = "BAD_RESPONSE: no usable verdict for this event";
                    self.charge(std::slice::from_ref(event), None, error, now).remove(0)
                }
            };
            updates.push(update);
        }
        let passed = |u: &Update| matches!(u, Update::Acknowledged { id, .. } if Some(*id) >= self.narrowed_through);
        if self.narrowed_through.is_some() && updates.iter().any(passed) {
            (self.slice_limit, self.narrowed_through) = (None, None);
        }
        updates
    }

    /// The request that carried `sent` failed as a whole (no answer, or a refused request).
    pub fn on_failure(&mut self, sent: &[EventState], failure: &Failure, now: Millis) -> Vec<Update> {
        let class = ErrorClass::of(failure.status, Some(&failure.code));
        let error = failure.describe();
        let policy = self.policy();
        match policy.on_request_failure(class, &failure.code, sent.len(), sent.len()) {
            OnFailure::Charge { budget } => self.charge(sent, budget, &error, now),
            OnFailure::Narrow { width } => {
                self.slice_limit = Some(width);
                self.narrowed_through = sent.iter().map(|e| e.id).max();
                sent.iter()
                    .map(|e| Update::Pending { id: e.id, attempts: e.attempts, retry_at: e.retry_at, error: Some(error.clone()) })
                    .collect()
            }
            OnFailure::BackOff => sent
                .iter()
                .map(|e| Update::Pending {
                    id: e.id,
                    attempts: e.attempts,
                    retry_at: Some(policy.backoff_until(e.attempts + 1, now, &mut self.prng)),
                    error: Some(error.clone()),
                })
                .collect(),
        }
    }

    /// One attempt charged to each of `events`, which failed together: each backs off (all until the
    /// same time) or, at its budget, becomes a dead letter.
    fn charge(&mut self, events: &[EventState], budget: Option<u32>, error: &str, now: Millis) -> Vec<Update> {
        let charges: Vec<(u32, u32)> = events
            .iter()
            .map(|e| (e.attempts + 1, budget.unwrap_or(e.max_attempts).min(e.max_attempts.max(1))))
            .collect();
        let charged = self.policy().charge_together(&charges, now, &mut self.prng);
        events
            .iter()
            .zip(charges.iter().zip(charged))
            .map(|(e, (&(attempts, _), charged))| match charged {
                Charged::RetryAt(at) => Update::Pending { id: e.id, attempts, retry_at: Some(at), error: Some(error.to_string()) },
                Charged::DeadLetter => {
                    self.slice_limit = None;
                    Update::DeadLetter { id: e.id, attempts, error: error.to_string() }
                }
            })
            .collect()
    }
}

/// A delete refused because the target holds no such row: the row was deleted there
/// (`DELETE_WINS`), or the delete affected no row and no row is rendered (`RLS_DENIED` with a null
/// `server_row`; the universe's service identity bypasses RLS, so it sees every row there is). The
/// delete's intent holds, so it is acknowledged (as skipped) rather than made a dead letter: this is
/// what a latest-only key created and deleted before delivery, or a delete following a dead letter,
/// gets.
fn already_gone(reason: Reason, verdict: Option<&kizuna_protocol::Verdict>) -> bool {
    match reason {
        Reason::DeleteWins => true,
        Reason::RlsDenied => verdict.is_some_and(|v| v.server_row.is_none()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kizuna_protocol::{Verdict, VerdictStatus};

    fn event(id: i64) -> EventState {
        EventState { id, key: Uuid::from_u128(id as u128), delete: false, apply_after: None, attempts: 0, max_attempts: 3, retry_at: None, error: None }
    }

    fn verdict(e: &EventState, status: VerdictStatus, reason: Option<Reason>) -> Verdict {
        Verdict { id: e.key, status, seq: None, reason, bucket: None, pk: None, message: Some("no".into()), server_row: None, replayed: false, server_row_text: None }
    }

    fn network() -> Failure {
        Failure { status: None, code: "NETWORK".into(), message: "connection refused".into() }
    }

    #[test]
    fn an_unreachable_target_costs_each_event_an_attempt_until_it_is_a_dead_letter() {
        let mut d = Delivery::new(DeliveryConfig { max_slice: 2, ..DeliveryConfig::default() }, 1);
        let mut pending = vec![event(1), event(2), event(3)];
        assert_eq!(d.next_slice(&pending, 0), vec![1, 2]);
        let mut now = 0;
        for round in 1..=3u32 {
            assert_eq!(d.next_slice(&pending, now), vec![1, 2], "round {round}");
            let updates = d.on_failure(&pending[..2], &network(), now);
            if round == 3 {
                for (u, id) in updates.iter().zip([1, 2]) {
                    assert_eq!(u, &Update::DeadLetter { id, attempts: 3, error: "NETWORK: connection refused".into() });
                }
                break;
            }
            for (e, u) in pending.iter_mut().zip(updates) {
                let Update::Pending { attempts, retry_at, error, .. } = u else { panic!("{u:?}") };
                assert_eq!((attempts, error.as_deref()), (round, Some("NETWORK: connection refused")));
                assert!(retry_at.unwrap() > now);
                (e.attempts, e.retry_at) = (attempts, retry_at);
            }
            assert!(d.next_slice(&pending, now).is_empty(), "the head backs off and blocks the queue");
            now = pending[0].retry_at.unwrap().max(pending[1].retry_at.unwrap());
        }
        assert_eq!(pending[2].attempts, 0, "events behind the blocked head were never charged");
    }

    /// A refusal of a whole request (a proxy's 413, a firewall's 403) narrows the slices only until
    /// the events of that request are through: they were one event wide for good after it.
    #[test]
    fn narrowed_slices_widen_again_once_the_refused_request_is_through() {
        let mut d = Delivery::new(DeliveryConfig { max_slice: 4, ..DeliveryConfig::default() }, 1);
        let pending: Vec<EventState> = (1..=10).map(event).collect();
        let proxy = Failure { status: Some(413), code: kizuna_protocol::codes::http_status(413), message: "Request Entity Too Large".into() };
        assert_eq!(d.next_slice(&pending, 0), vec![1, 2, 3, 4]);
        d.on_failure(&pending[..4], &proxy, 0);
        assert_eq!(d.next_slice(&pending, 0), vec![1, 2], "a 413 halves, whoever sent it");
        let applied = |d: &mut Delivery, events: &[EventState]| {
            let verdicts = events.iter().map(|e| verdict(e, VerdictStatus::Applied, None)).collect();
            d.on_response(events, &PushResponse { verdicts, last_mutation_id: 0 }, 0)
        };
        applied(&mut d, &pending[..2]);
        assert_eq!(d.next_slice(&pending[2..], 0), vec![3, 4], "still narrow within the refused request");
        applied(&mut d, &pending[2..4]);
        assert_eq!(d.next_slice(&pending[4..], 0), vec![5, 6, 7, 8], "wide again past it");
    }

    #[test]
    fn delayed_refunds_and_holds_without_blocking_refused_dies_at_once() {
        let mut d = Delivery::new(DeliveryConfig::default(), 1);
        let mut held = event(1);
        held.apply_after = Some(5_000);
        held.attempts = 2;
        let refused = event(2);
        let applied = event(3);
        assert_eq!(d.next_slice(&[held.clone(), refused.clone(), applied.clone()], 0), vec![1, 2, 3], "the target judges apply_after");
        let response = PushResponse {
            verdicts: vec![
                verdict(&held, VerdictStatus::Delayed, None),
                verdict(&refused, VerdictStatus::Rejected, Some(Reason::ValidationFailed)),
                verdict(&applied, VerdictStatus::Skipped, None),
            ],
            last_mutation_id: 3,
        };
        let updates = d.on_response(&[held.clone(), refused, applied], &response, 0);
        assert_eq!(updates[0], Update::Pending { id: 1, attempts: 0, retry_at: Some(5_000), error: None });
        assert_eq!(updates[1], Update::DeadLetter { id: 2, attempts: 0, error: "REJECTED VALIDATION_FAILED: no".into() });
        assert_eq!(updates[2], Update::Acknowledged { id: 3, skipped: true });
        held.retry_at = Some(5_000);
        let later = event(4);
        assert_eq!(d.next_slice(&[held.clone(), later.clone()], 10), vec![4], "a held event does not block");
        assert_eq!(d.next_send_at(&[held.clone()], 10), Some(5_000));
        assert_eq!(d.next_slice(&[held, later], 5_000), vec![1, 4]);
    }

    #[test]
    fn a_delete_of_a_row_the_target_does_not_hold_is_acknowledged() {
        let mut d = Delivery::new(DeliveryConfig::default(), 1);
        let mut gone = event(1);
        gone.delete = true;
        let mut refused = event(2);
        refused.delete = true;
        let upsert = event(3);
        let mut hidden_row = verdict(&refused, VerdictStatus::Rejected, Some(Reason::RlsDenied));
        hidden_row.server_row = Some(Default::default());
        let response = PushResponse {
            verdicts: vec![verdict(&gone, VerdictStatus::Rejected, Some(Reason::RlsDenied)), hidden_row,
                           verdict(&upsert, VerdictStatus::Rejected, Some(Reason::RlsDenied))],
            last_mutation_id: 3,
        };
        let updates = d.on_response(&[gone, refused, upsert], &response, 0);
        assert_eq!(updates[0], Update::Acknowledged { id: 1, skipped: true });
        assert!(matches!(updates[1], Update::DeadLetter { id: 2, .. }), "the row is there: a real refusal");
        assert!(matches!(updates[2], Update::DeadLetter { id: 3, .. }));
    }

    #[test]
    fn a_permanent_refusal_narrows_until_the_culprit_goes_alone() {
        let mut d = Delivery::new(DeliveryConfig { max_slice: 8, ..DeliveryConfig::default() }, 1);
        let pending: Vec<EventState> = (1..=8).map(event).collect();
        let too_big = Failure { status: Some(413), code: "KZG01".into(), message: "body too large".into() };
        let updates = d.on_failure(&pending, &too_big, 0);
        assert!(updates.iter().all(|u| matches!(u, Update::Pending { attempts: 0, retry_at: None, .. })), "{updates:?}");
        assert_eq!(d.next_slice(&pending, 0).len(), 4, "halved");
        let row_too_large = Failure { status: Some(400), code: "KZP04".into(), message: "row too large".into() };
        let updates = d.on_failure(&pending[..1], &row_too_large, 0);
        assert_eq!(updates, vec![Update::DeadLetter { id: 1, attempts: 1, error: "KZP04: row too large".into() }]);
        assert_eq!(d.next_slice(&pending[1..], 0).len(), 7, "the width is restored once the culprit died");
    }
}
