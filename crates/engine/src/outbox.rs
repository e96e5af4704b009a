//! Local writes: validation, outbox entries, latest-only coalescing, read-your-writes.

use std::collections::BTreeMap;

use kizuna_protocol::{Op, Row};

use crate::engine::Engine;
use crate::inputs::{EngineError, LocalWrite};
use crate::rebase::{apply_op, row_op};
use crate::records::{Millis, OutboxEntry, RowKey, RowRecord};
use crate::transaction::{ChangeOrigin, Event, StoreOp, Transaction};

impl Engine {
    /// Records local writes. One call is one atomic group: with several writes they share a
    /// fresh batch id and the server applies all or none. `current` holds the stored record of
    /// every key the writes touch (read in the same IndexedDB transaction the result is applied
    /// in); a key missing from it counts as never stored.
    ///
    /// The result puts the new visible rows, the outbox entries and the meta record (with the
    /// advanced `next_seq` and HLC) in one transaction, and says `Change { origin: Local }`.
    /// Invalid input returns an error and changes nothing.
    pub fn write(
        &mut self,
        now: Millis,
        writes: Vec<LocalWrite>,
        current: &BTreeMap<RowKey, RowRecord>,
    ) -> Result<Transaction, EngineError> {
        validate(&writes)?;
        let batch = if writes.len() > 1 { Some(self.prng.uuid_v4()) } else { None };
        let mut tx = Transaction::default();
        let mut touched: BTreeMap<RowKey, RowRecord> = BTreeMap::new();

        for write in writes {
            let key = RowKey::new(write.table.clone(), write.pk.clone());
            let latest_only =
                write.latest_only.unwrap_or_else(|| self.config.latest_only_tables.contains(&write.table));
            let mut entry = OutboxEntry {
                seq: self.take_seq(),
                id: self.prng.uuid_v4(),
                table: write.table,
                pk: write.pk,
                op: write.op,
                columns: write.columns,
                hlc: self.take_hlc(now),
                read_seq: self.meta.checkpoint.horizon,
                batch,
                apply_after: write.apply_after,
                latest_only,
                created_at: now,
                sent: false,
                attempts: 0,
                permanent_failures: 0,
                retry_at: None,
                last_error: None,
            };
            // Never across atomic groups: a batch member must neither swallow nor be swallowed.
            if batch.is_none() && latest_only {
                if let Some(replaced) = self.coalesce_into(&mut entry) {
                    tx.ops.push(StoreOp::DeleteOutbox(replaced));
                }
            }

            let record = touched.entry(key.clone()).or_insert_with(|| {
                current.get(&key).cloned().or_else(|| self.rows.get(&key).cloned()).unwrap_or_else(|| RowRecord::empty(&key))
            });
            // Read your writes: the visible row already holds the earlier pending writes, so
            // applying this one on top equals replaying everything over the base.
            record.visible = apply_op(record.visible.take(), entry.op, entry.columns.as_ref());
            self.outbox.insert(entry.seq, entry.clone());
            tx.ops.push(StoreOp::PutOutbox(entry));
        }

        let keys: Vec<RowKey> = touched.keys().cloned().collect();
        for (key, record) in touched {
            self.rows.insert(key, record.clone());
            tx.ops.push(row_op(record));
        }
        tx.ops.push(self.put_meta());
        tx.events.push(Event::Change { keys, origin: ChangeOrigin::Local, tables: Vec::new() });
        Ok(tx)
    }

    /// Settles a `write` taken before its keys' stored records were read (with an empty
    /// `current`), now that they are (`found`): each key found stored gets the record `write`
    /// would have made with it in `current`, the step's entries for that key replayed over it.
    /// Returns the records to put again over the step's own: those that differ from what it put,
    /// or with `all` every record it put (the tokens of a new index declaration).
    pub fn settle_unread(&mut self, step: &Transaction, found: &BTreeMap<RowKey, RowRecord>, all: bool) -> Vec<StoreOp> {
        let mut again = Vec::new();
        let Some(Event::Change { keys, .. }) = step.events.first() else { return again };
        for key in keys {
            let Some(guessed) = self.rows.get(key) else { continue };
            let record = match found.get(key) {
                Some(stored) => step.ops.iter().fold(stored.clone(), |mut record, op| {
                    if let StoreOp::PutOutbox(entry) = op {
                        if entry.table == key.table && entry.pk == key.pk {
                            record.visible = apply_op(record.visible.take(), entry.op, entry.columns.as_ref());
                        }
                    }
                    record
                }),
                None => guessed.clone(),
            };
            if all || record != *guessed {
                self.rows.insert(key.clone(), record.clone());
                again.push(row_op(record));
            }
        }
        again
    }

    /// Latest-only coalescing: when the newest pending entry for the new entry's key is an
    /// unsent, latest-only lone write, the new entry absorbs it (keeping everything it
    /// assigned) and it leaves the outbox. Returns the replaced `seq`.
    ///
    /// Both sides must be latest-only: a write made under the plain policy was promised
    /// delivery. A sent entry is never replaced because the server may already hold it.
    fn coalesce_into(&mut self, entry: &mut OutboxEntry) -> Option<i64> {
        let key = entry.key();
        let newest = self.pending_for(&key).last()?;
        if newest.sent || newest.batch.is_some() || !newest.latest_only {
            return None;
        }
        let (op, columns) = merge(newest.op, newest.columns.as_ref(), entry.op, entry.columns.as_ref())?;
        let replaced = newest.seq;
        entry.op = op;
        entry.columns = columns;
        self.outbox.remove(&replaced);
        Some(replaced)
    }
}

/// One write equivalent to `older` followed by `newer`, if there is one. A delete overwrites
/// everything; a patch merges into an older patch or upsert, and an upsert into an older upsert.
/// The other pairs have no single-write equivalent, so they are kept apart: an upsert after a
/// patch creates a missing row the patch would not have, and after a delete it would assign the
/// named columns of the deleted row instead of starting a new one.
fn merge(older: Op, older_cols: Option<&Row>, newer: Op, newer_cols: Option<&Row>) -> Option<(Op, Option<Row>)> {
    match (older, newer) {
        (_, Op::Delete) => Some((Op::Delete, None)),
        (Op::Patch | Op::Upsert, Op::Patch) | (Op::Upsert, Op::Upsert) => {
            Some((older, apply_op(older_cols.cloned(), Op::Patch, newer_cols)))
        }
        (Op::Patch | Op::Delete, Op::Upsert) | (Op::Delete, Op::Patch) => None,
    }
}

/// Refuses what the server would refuse as malformed, before anything is stored.
fn validate(writes: &[LocalWrite]) -> Result<(), EngineError> {
    if writes.is_empty() {
        return Err(EngineError::invalid("no writes given"));
    }
    for (i, w) in writes.iter().enumerate() {
        if w.table.is_empty() || w.pk.is_empty() {
            return Err(EngineError::invalid(format!("write {i}: table and pk must not be empty")));
        }
        match (w.op, &w.columns) {
            (Op::Upsert | Op::Patch, None) => {
                return Err(EngineError::invalid(format!("write {i}: {:?} needs a columns object", w.op)));
            }
            (Op::Delete, Some(_)) => {
                return Err(EngineError::invalid(format!("write {i}: delete takes no columns")));
            }
            _ => {}
        }
        if w.apply_after.is_some_and(|t| !crate::wire_time::WIRE_TIMES.contains(&t)) {
            return Err(EngineError::invalid(format!(
                "write {i}: apply_after must fall in the years 1 to 9999, the times the wire can name"
            )));
        }
    }
    Ok(())
}
