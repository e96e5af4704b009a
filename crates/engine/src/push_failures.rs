//! Whole-request push failures: retry with backoff, charge a lone unit, or narrow the slice, as
//! the outbox policy (`outbox_policy.rs`, shared with universe sync) decides.
//!
//! Classification is `ErrorClass::of(status, code)`, shared with the server crate. Retryable
//! failures (network, timeout, 5xx, 401, `AUTH_SESSION_*`, anything unknown) never touch the
//! dead-letter budget. A permanent failure is charged only to a slice of exactly one delivery
//! unit; a wider slice is narrowed (see `delivery.rs`) and resent at once.

use kizuna_protocol::ErrorClass;

use crate::engine::Engine;
use crate::inputs::Failure;
use crate::outbox_policy::{Charged, OnFailure};
use crate::records::Millis;
use crate::transaction::{Event, StoreOp, Transaction};

impl Engine {
    /// Handles a push request that failed as a whole. Retryable (by `ErrorClass::of`): every
    /// entry backs off, nothing is charged. Permanent: a slice of one unit is charged (and
    /// dead-lettered at `max_permanent_failures`); a wider slice is narrowed and resent at once.
    pub fn on_push_failure(&mut self, now: Millis, failure: Failure) -> Transaction {
        let Some(in_flight) = self.push.take_answered() else {
            return Transaction::default();
        };
        // A slice sent ahead of this one is answered after it, and this one's verdicts are now
        // unknown: taking the later verdicts first would put writes the server judged later under
        // earlier ones still pending here (a row showing an older write than the server holds).
        // Its answer is let go, as a lost one: its writes go again after these, under the same ids,
        // and the server answers both from its ledger.
        self.push.forget();
        let class = ErrorClass::of(failure.status, Some(&failure.code));
        let error = failure.describe();
        self.note_failure(error.clone());
        self.push.streak += 1;
        let mut tx = Transaction::default();
        tx.events.push(Event::PushFailed {
            code: failure.code.clone(),
            message: failure.message.clone(),
            retryable: class.is_retryable(),
        });

        let width: usize = in_flight.units.iter().map(Vec::len).sum();
        let policy = self.config.retry_policy();
        match policy.on_request_failure(class, &failure.code, in_flight.units.len(), width) {
            OnFailure::BackOff => {
                let retry_at = policy.backoff_until(self.push.streak, now, &mut self.prng);
                for seq in in_flight.seqs() {
                    if let Some(e) = self.outbox.get_mut(&seq) {
                        e.retry_at = Some(retry_at);
                        e.last_error = Some(error.clone());
                        tx.ops.push(StoreOp::PutOutbox(e.clone()));
                    }
                }
            }
            OnFailure::Charge { budget } => {
                let budget = budget.unwrap_or(self.config.max_permanent_failures);
                for unit in &in_flight.units {
                    self.charge_unit(now, unit, budget, &error, &mut tx);
                }
            }
            OnFailure::Narrow { width } => {
                self.meta.slice_limit = Some(width as u32);
                for seq in in_flight.seqs() {
                    if let Some(e) = self.outbox.get_mut(&seq) {
                        e.last_error = Some(error.clone());
                        tx.ops.push(StoreOp::PutOutbox(e.clone()));
                    }
                }
                tx.ops.push(self.put_meta());
            }
        }
        tx
    }

    /// Charges one failure to a delivery unit (the outbox policy decides which failures are
    /// charged): below its budget it backs off (blocking the queue, to keep issue order), at the
    /// budget it is dead-lettered.
    fn charge_unit(&mut self, now: Millis, unit: &[i64], budget: u32, error: &str, tx: &mut Transaction) {
        let mut used = 0;
        for seq in unit {
            if let Some(e) = self.outbox.get_mut(seq) {
                e.permanent_failures += 1;
                e.last_error = Some(error.to_string());
                used = used.max(e.permanent_failures);
            }
        }
        match self.config.retry_policy().charge(used, budget, now, &mut self.prng) {
            Charged::DeadLetter => self.dead_letter_unit(now, unit, error, tx),
            Charged::RetryAt(at) => {
                for seq in unit {
                    if let Some(e) = self.outbox.get_mut(seq) {
                        e.retry_at = Some(at);
                        tx.ops.push(StoreOp::PutOutbox(e.clone()));
                    }
                }
            }
        }
    }
}
