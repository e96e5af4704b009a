//! The server's per-mutation verdicts on the push in flight.
//!
//! `APPLIED` and `SKIPPED` acknowledge (a `replayed` verdict exactly like a first one: the
//! ledger returns what it recorded, the effect happened once). `REJECTED` compensates: the
//! base becomes the server's row and the still-pending writes for the key are replayed on top.
//! `DELAYED` keeps the entry pending, refunding the attempt. Nothing is dropped quietly: a
//! mutation without a usable verdict stays pending and backs off.

use std::collections::BTreeMap;

use kizuna_protocol::{PushResponse, Verdict, VerdictStatus};

use crate::engine::Engine;
use crate::rebase::apply_owned;
use crate::records::{Millis, OutboxEntry, RowKey, RowRecord};
use crate::transaction::{ChangeOrigin, Event, StoreOp, Transaction};

impl Engine {
    /// Where a verdict moves its mutation's row: the key in the server's one spelling, when the
    /// mutation sent another (an upper-case uuid). Only verdicts the engine acts on move rows.
    fn respelling(v: &Verdict, pk: &str) -> Option<String> {
        let acted_on = v.status == VerdictStatus::Applied || (v.status == VerdictStatus::Rejected && v.reason.is_some());
        v.pk.as_ref().filter(|canonical| acted_on && canonical.as_str() != pk).cloned()
    }

    /// The keys `response` moves rows to that this engine does not hold: the adapter reads their
    /// stored records in the answer's step and hands them over with [`Engine::remember_respelled`]
    /// before [`Engine::on_push_response`], which merges the moved row into what is stored there
    /// (a row pulled under the server's spelling before).
    pub fn respelled_keys(&self, response: &PushResponse) -> Vec<RowKey> {
        let Some(in_flight) = &self.push.in_flight else { return Vec::new() };
        let keys = in_flight
            .seqs()
            .filter_map(|seq| self.outbox.get(&seq))
            .filter_map(|e| {
                let v = response.verdicts.iter().find(|v| v.id == e.id)?;
                Some(RowKey::new(e.table.clone(), Self::respelling(v, &e.pk)?))
            })
            .filter(|key| !self.holds_row(key));
        crate::order::set_of(keys).into_iter().collect()
    }

    /// The stored records of [`Engine::respelled_keys`] (a key missing from `found` has none).
    pub fn remember_respelled(&mut self, keys: &[RowKey], found: &BTreeMap<RowKey, RowRecord>) {
        for key in keys {
            let record = found.get(key).cloned().unwrap_or_else(|| RowRecord::empty(key));
            self.respelled.insert(key.clone(), record);
        }
    }

    /// Moves what this device holds under `from` to `to`, the server's spelling of the same key:
    /// the pending writes of `from` name `to` from now on (their own verdicts then name no other
    /// key), and the row under `from` is left with no base, since the server holds no row under
    /// that spelling; a base it had (this device's writes the server confirmed before it answered
    /// with the spelling) is kept at `to` unless a row is stored there already.
    fn respell(&mut self, from: &RowKey, to: &RowKey, tx: &mut Transaction) {
        let seqs: Vec<i64> = self.outbox.for_key(from).map(|e| e.seq).collect();
        for seq in seqs {
            let mut entry = self.outbox.remove(&seq).expect("listed by its key");
            entry.pk = to.pk.clone();
            tx.ops.push(StoreOp::PutOutbox(entry.clone()));
            self.outbox.insert(seq, entry);
        }
        let mut moved = self.mirrored(from);
        let mut record = match self.rows.get(to) {
            Some(held) => held.clone(),
            None => self.respelled.remove(to).unwrap_or_else(|| RowRecord::empty(to)),
        };
        if record.base.is_none() && record.visible.is_none() {
            record.base = moved.base.take();
            record.bucket = moved.bucket.take();
        }
        moved.base = None;
        self.rows.insert(from.clone(), moved);
        self.rows.insert(to.clone(), record);
    }

    /// True when a verdict names a bucket this device does not pull: the row is not part of the
    /// device's data (no pull of its would ever bring or remove it), so it is not kept once no write
    /// of ours is pending.
    fn outside_buckets(&self, bucket: Option<&str>) -> bool {
        bucket.is_some_and(|b| !self.config.buckets.iter().any(|mine| mine == b))
    }

    /// Handles the server's answer to the request in flight: one verdict per mutation.
    /// `APPLIED` and `SKIPPED` acknowledge (a `replayed` verdict exactly like a first one);
    /// `REJECTED` compensates; `DELAYED` keeps the entry without counting the attempt. A
    /// mutation without a usable verdict stays pending and backs off like a retryable failure.
    pub fn on_push_response(&mut self, now: Millis, response: PushResponse) -> Transaction {
        let Some(in_flight) = self.push.take_answered() else {
            self.respelled.clear();
            return Transaction::default();
        };
        self.note_success(now);
        self.push.streak = 0;
        let mut tx = Transaction::default();
        let mut touched: Vec<RowKey> = Vec::new();
        let mut compensated: Vec<RowKey> = Vec::new();
        let mut unanswered = 0usize;

        // The server answers in the request's order. While every verdict so far stood at its
        // mutation's place, the one at this place is also the first with its id (the ids of a
        // slice differ); otherwise the first with the id is searched for (a slice of 256 searched
        // for each of its verdicts).
        let mut in_order = true;
        for (n, seq) in in_flight.seqs().enumerate() {
            let Some(sent) = self.outbox.get(&seq) else {
                in_order = false;
                continue;
            };
            let at_place = response.verdicts.get(n).filter(|v| in_order && v.id == sent.id);
            in_order = at_place.is_some();
            let verdict = at_place.or_else(|| response.verdicts.iter().find(|v| v.id == sent.id));
            if let Some(canonical) = verdict.and_then(|v| Self::respelling(v, &sent.pk)) {
                let (from, to) = (sent.key(), RowKey::new(sent.table.clone(), canonical));
                self.respell(&from, &to, &mut tx);
                touched.push(from);
            }
            let Some(key) = self.outbox.get(&seq).map(OutboxEntry::key) else { continue };
            match verdict.map(|v| (v.status, v)) {
                Some((VerdictStatus::Applied | VerdictStatus::Skipped, v)) => {
                    let mut entry = self.outbox.remove(&seq).expect("live");
                    tx.ops.push(StoreOp::DeleteOutbox(seq));
                    if v.status == VerdictStatus::Applied {
                        self.meta.counters.applied += 1;
                    } else {
                        self.meta.counters.skipped += 1;
                    }
                    // The server now holds this write. When no committed pull reflects it yet,
                    // fold it into the base, so compensating a later write on the key cannot
                    // make it vanish before the next pull. A pull at or past its commit already
                    // brought the server's row, which may hold newer writes: keep that. A
                    // SKIPPED write names no commit, so only a pull can say what the row is now.
                    match v.seq.filter(|_| v.status == VerdictStatus::Applied) {
                        Some(seq) if seq > self.meta.checkpoint.horizon => {
                            let outside = self.outside_buckets(v.bucket.as_deref());
                            let record = self.rows.entry(key.clone()).or_insert_with(|| RowRecord::empty(&key));
                            record.base = if outside { None } else { apply_owned(record.base.take(), entry.op, entry.columns.take()) };
                            // Placed in its bucket now, so bucket queries keep finding the app's
                            // own row between this verdict and the pull that brings it.
                            if v.bucket.is_some() || record.base.is_none() {
                                record.bucket = v.bucket.clone();
                            }
                        }
                        _ => self.pull.requested = true,
                    }
                    touched.push(key.clone());
                    tx.events.push(Event::Applied { id: entry.id, key, seq: v.seq, bucket: v.bucket.clone() });
                }
                Some((VerdictStatus::Rejected, v)) if v.reason.is_some() => {
                    let entry = self.outbox.remove(&seq).expect("live");
                    tx.ops.push(StoreOp::DeleteOutbox(seq));
                    self.meta.counters.rejected += 1;
                    // A first refusal's row is the server's row now; a replayed one was recorded
                    // when the write was first judged and may be older than what a pull since
                    // brought, so the base stays and a pull says what the row is now. So it does
                    // for a row nested too deep to decode, which the engine cannot hold.
                    if v.replayed || v.server_row_text.is_some() {
                        self.pull.requested = true;
                    } else {
                        // The server's row, unless it lies in a bucket this device does not pull.
                        let outside = self.outside_buckets(v.bucket.as_deref());
                        let mut record = self.mirrored(&key);
                        record.base = if outside { None } else { v.server_row.clone() };
                        if v.bucket.is_some() {
                            record.bucket = v.bucket.clone();
                        }
                        self.rows.insert(key.clone(), record);
                    }
                    compensated.push(key);
                    tx.events.push(Event::Rejected {
                        mutation: entry,
                        reason: v.reason.expect("checked"),
                        message: v.message.clone(),
                        server_row: v.server_row.clone(),
                        server_row_text: v.server_row_text.clone(),
                    });
                }
                Some((VerdictStatus::Delayed, _)) => {
                    self.meta.counters.delayed += 1;
                    let policy = self.config.retry_policy();
                    let e = self.outbox.get_mut(&seq).expect("live");
                    e.attempts = e.attempts.saturating_sub(1);
                    e.permanent_failures = 0;
                    e.retry_at = Some(policy.delayed_until(e.apply_after, now));
                    e.last_error = None; // its wait is the window's, not a failure's (`Timing::failed`)
                    tx.ops.push(StoreOp::PutOutbox(e.clone()));
                }
                // No verdict, or a refusal without its reason: not an answer we may act on.
                _ => {
                    unanswered += 1;
                    let attempts = self.outbox[&seq].attempts;
                    let retry_at = self.config.retry_policy().backoff_until(attempts, now, &mut self.prng);
                    let e = self.outbox.get_mut(&seq).expect("live");
                    e.retry_at = Some(retry_at);
                    e.last_error = Some("BAD_RESPONSE: no usable verdict for this mutation".into());
                    tx.ops.push(StoreOp::PutOutbox(e.clone()));
                }
            }
        }

        // Settle each key once, after all its verdicts moved the base.
        let mut remote_changes = Vec::new();
        let all = crate::order::set_of(touched.iter().chain(&compensated).cloned());
        for key in all {
            // Taken out, not cloned: `settle_row` puts it back while the key is still tracked.
            let mut record = self.rows.remove(&key).unwrap_or_else(|| RowRecord::empty(&key));
            let before = record.visible.take();
            let op = self.settle_row(record);
            let changed = match &op {
                StoreOp::PutRow(r) => r.visible != before,
                _ => before.is_some(),
            };
            tx.ops.push(op);
            if changed && !compensated.contains(&key) {
                remote_changes.push(key);
            }
        }
        if !remote_changes.is_empty() {
            tx.events.push(Event::Change { keys: remote_changes, origin: ChangeOrigin::Remote, tables: Vec::new() });
        }
        if !compensated.is_empty() {
            crate::order::sort(&mut compensated);
            compensated.dedup();
            tx.events.push(Event::Change { keys: compensated, origin: ChangeOrigin::Compensation, tables: Vec::new() });
        }
        if unanswered > 0 {
            let message = format!("{unanswered} mutation(s) came back without a usable verdict");
            self.health.last_error = Some(format!("BAD_RESPONSE: {message}"));
            tx.events.push(Event::PushFailed { code: "BAD_RESPONSE".into(), message, retryable: true });
        }
        if self.outbox.is_empty() {
            self.meta.slice_limit = None;
        }
        self.respelled.clear();
        tx.ops.push(self.put_meta());
        tx
    }

}
