//! Dead letters: writes given up on after their budget of permanent refusals, kept until the
//! app requeues or discards them. Both act on the whole atomic group the entry belongs to,
//! since its members can only ever apply together.

use std::collections::BTreeSet;

use crate::engine::Engine;
use crate::inputs::EngineError;
use crate::records::{DeadLetter, Millis, RowKey};
use crate::transaction::{ChangeOrigin, Event, StoreOp, Transaction};

impl Engine {
    /// Moves a delivery unit to the dead-letter store and lets the queue move on: its local
    /// effect is compensated (visible = base with the remaining pending writes), the narrowed
    /// slice width is reset (the search found its culprit), one `DeadLetter` event per entry.
    pub(crate) fn dead_letter_unit(&mut self, now: Millis, unit: &[i64], error: &str, tx: &mut Transaction) {
        let mut keys = BTreeSet::new();
        for seq in unit {
            let Some(entry) = self.outbox.remove(seq) else { continue };
            keys.insert(entry.key());
            let letter = DeadLetter { entry: entry.clone(), error: error.to_string(), dead_at: now };
            self.dead.push(letter.clone());
            self.meta.counters.dead_lettered += 1;
            tx.ops.push(StoreOp::DeleteOutbox(*seq));
            tx.ops.push(StoreOp::PutDead(letter));
            tx.events.push(Event::DeadLetter { entry, error: error.to_string() });
        }
        crate::order::sort_by_key(&mut self.dead, |d| d.entry.seq);
        self.meta.slice_limit = None;
        self.compensate(keys, ChangeOrigin::Compensation, tx);
        tx.ops.push(self.put_meta());
    }

    /// Puts a dead letter (with the rest of its atomic group) back into the outbox as NEW
    /// writes: new ids, new seqs, new HLCs, a fresh budget. A new `client_seq` is required
    /// because the old one may be at or below the server's watermark, where it would be
    /// answered `SKIPPED` without effect; the old id may have a recorded verdict. The write
    /// keeps its `read_seq` (what its author had seen) and its delay window.
    pub fn requeue_dead(&mut self, now: Millis, seq: i64) -> Result<Transaction, EngineError> {
        let group = self.dead_group(seq)?;
        let batch = group.first().and_then(|d| d.entry.batch).map(|_| self.prng.uuid_v4());
        let mut tx = Transaction::default();
        let mut keys = BTreeSet::new();
        for letter in group {
            let mut entry = letter.entry;
            tx.ops.push(StoreOp::DeleteDead(entry.seq));
            entry.seq = self.take_seq();
            entry.id = self.prng.uuid_v4();
            entry.hlc = self.take_hlc(now);
            entry.batch = batch;
            entry.sent = false;
            entry.attempts = 0;
            entry.permanent_failures = 0;
            entry.retry_at = None;
            entry.last_error = None;
            keys.insert(entry.key());
            self.outbox.insert(entry.seq, entry.clone());
            tx.ops.push(StoreOp::PutOutbox(entry));
        }
        self.compensate(keys, ChangeOrigin::Local, &mut tx);
        tx.ops.push(self.put_meta());
        Ok(tx)
    }

    /// Drops a dead letter (with the rest of its atomic group) for good and restores the
    /// visible row from the base and whatever is still pending.
    pub fn discard_dead(&mut self, seq: i64) -> Result<Transaction, EngineError> {
        let group = self.dead_group(seq)?;
        let mut tx = Transaction::default();
        let mut keys = BTreeSet::new();
        for letter in group {
            keys.insert(letter.entry.key());
            tx.ops.push(StoreOp::DeleteDead(letter.entry.seq));
        }
        self.compensate(keys, ChangeOrigin::Compensation, &mut tx);
        Ok(tx)
    }

    /// Removes and returns the dead letter `seq` and the other members of its atomic group.
    fn dead_group(&mut self, seq: i64) -> Result<Vec<DeadLetter>, EngineError> {
        let Some(found) = self.dead.iter().find(|d| d.entry.seq == seq) else {
            return Err(EngineError::not_found(format!("no dead letter with seq {seq}")));
        };
        let batch = found.entry.batch;
        let (group, rest): (Vec<DeadLetter>, Vec<DeadLetter>) = std::mem::take(&mut self.dead)
            .into_iter()
            .partition(|d| d.entry.seq == seq || (batch.is_some() && d.entry.batch == batch));
        self.dead = rest;
        Ok(group)
    }

    /// Recomputes the visible rows of `keys` from their bases and the live outbox, and says so.
    pub(crate) fn compensate(&mut self, keys: BTreeSet<RowKey>, origin: ChangeOrigin, tx: &mut Transaction) {
        if keys.is_empty() {
            return;
        }
        for key in &keys {
            let record = self.mirrored(key);
            tx.ops.push(self.settle_row(record));
        }
        tx.events.push(Event::Change { keys: keys.into_iter().collect(), origin, tables: Vec::new() });
    }
}
