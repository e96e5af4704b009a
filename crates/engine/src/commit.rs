//! The checkpoint commit, driven by the adapter inside ONE IndexedDB transaction.
//!
//! The staged pages can hold 100,000 rows, so the engine never needs them in memory: the
//! adapter reads them back page by page and asks the plan for each entry's store op. The
//! plan holds only a snapshot of the pending writes (to replay them over each new base) and
//! the keys it saw (for the change event).
//!
//! ```text
//! if plan.rehydrate() { apply ClearRows }
//! for page_no in 0..plan.staged_pages() {          // read back from `staging`
//!     for entry in page.entries { if let Some(op) = plan.materialize(entry) { apply op } }
//! }
//! if let Some(text) = plan.take_closing_text() {   // a closing page handed over as text
//!     for entry in page(text).entries { ...as a staged page's... }
//! }
//! apply plan.finish(&mut engine, now)              // same IndexedDB transaction
//! ```
//! Make no other engine call between `on_pull_page` returning `Commit` and `finish`; if the
//! IndexedDB transaction fails, call `on_pull_failure` so the run is abandoned.

use std::collections::{BTreeMap, BTreeSet};

use kizuna_protocol::{Entry, Lifecycle};

use crate::engine::Engine;
use crate::pull::PullRun;
use crate::rebase::{replay, row_op};
use crate::records::{Checkpoint, Millis, OutboxEntry, RowKey, RowRecord};
use crate::transaction::{ChangeOrigin, Event, StoreOp, Transaction};

/// The commit of a pull run that reached `done: true`.
#[derive(Debug)]
pub struct CommitPlan {
    run: PullRun,
    /// The closing page's cursor and horizon, which become the checkpoint's.
    cursor: String,
    horizon: i64,
    /// The closing page's entries: decoded (`finish` materializes them), or its text (the adapter
    /// places them as a staged page's, `take_closing_text`).
    closing: ClosingEntries,
    /// Pending entries by key, in seq order, as of the closing page.
    pending: BTreeMap<RowKey, Vec<OutboxEntry>>,
    /// Keys with a pending entry or a dead letter: their new records update the engine's mirror.
    tracked: BTreeSet<RowKey>,
    /// New records of tracked keys, as materialized.
    tracked_records: BTreeMap<RowKey, RowRecord>,
    /// The keys the run delivered, up to `LISTED_CHANGES`; past it, the tables of the others.
    changed: BTreeSet<RowKey>,
    changed_tables: BTreeSet<String>,
    /// The last key delivered live, with its sequence number. A row that moves between two
    /// requested buckets comes as a live entry in the new bucket and a tombstone in the old one, at
    /// the same seq, next to each other in the stream's (seq, table, pk, bucket) order: the
    /// tombstone only says the row left the old bucket, so after the live entry it must not delete
    /// the row. Remembering one key keeps a run's memory bounded, whatever one commit held.
    last_live: Option<(i64, RowKey)>,
}

/// The closing page's entries as the engine took them.
#[derive(Debug)]
pub(crate) enum ClosingEntries {
    Decoded(Vec<Entry>),
    Text(String),
}

/// What a staged entry becomes (`CommitPlan::place`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Store the record `{table, pk, bucket, base: row}`: the server's row is what the app sees.
    /// A live entry that came without a row is a `DeleteRow`, as `materialize` makes it.
    ServerRow,
    /// `DeleteRow` for the key.
    Delete,
    /// Nothing: a moved row's tombstone in its old bucket.
    Skip,
    /// A write of ours touches the key: decode the row and call `materialize`.
    Replay,
}

/// A run's `change` event names at most this many keys; past it, it names their tables (`tables`),
/// so the event and the run's memory do not grow with a large sync.
pub const LISTED_CHANGES: usize = 10_000;

impl CommitPlan {
    fn note_changed(&mut self, key: RowKey) {
        if self.changed.len() < LISTED_CHANGES || self.changed.contains(&key) {
            self.changed.insert(key);
        } else if !self.changed_tables.contains(&key.table) {
            self.changed_tables.insert(key.table);
        }
    }

    pub(crate) fn new(engine: &Engine, run: PullRun, cursor: String, horizon: i64, closing: ClosingEntries) -> CommitPlan {
        let mut pending: BTreeMap<RowKey, Vec<OutboxEntry>> = BTreeMap::new();
        for entry in engine.outbox.values() {
            pending.entry(entry.key()).or_default().push(entry.clone());
        }
        let tracked = crate::order::set_of(pending.keys().cloned().chain(engine.dead.iter().map(|d| d.entry.key())));
        CommitPlan {
            run,
            cursor,
            horizon,
            closing,
            pending,
            tracked,
            tracked_records: BTreeMap::new(),
            changed: BTreeSet::new(),
            changed_tables: BTreeSet::new(),
            last_live: None,
        }
    }

    /// True when this run replaces the local snapshot: every run from `null` does (the first
    /// one, a rehydrate after a lifecycle signal, a new bucket set), since it delivers no
    /// tombstones, so a row it does not deliver is not in the snapshot. Apply `ClearRows` before
    /// anything else (the outbox is kept; `finish` re-materializes the keys only it still holds).
    /// Without it, a row the device wrote, saw acknowledged and then saw leave its buckets (moved
    /// or deleted elsewhere) before its first pull would stay on the device for ever.
    pub fn rehydrate(&self) -> bool {
        self.run.from_null
    }

    /// The horizon of the run's first page: a run's entries at or below it are the state of that
    /// snapshot, each key's once (a key written while the run went on comes again above it, on a
    /// later page, where the later entry wins).
    pub fn first_horizon(&self) -> Option<i64> {
        self.run.first_horizon
    }

    /// The lifecycle signal behind a rehydrate, if any.
    pub fn lifecycle(&self) -> Option<Lifecycle> {
        self.run.rehydrate
    }

    /// How many pages sit in `staging` for this run (`page_no` 0 to this, exclusive). The
    /// closing page is not among them: `finish` materializes it, or, handed over as text, the
    /// adapter places it after them (`take_closing_text`).
    pub fn staged_pages(&self) -> u32 {
        self.run.pages - 1
    }

    /// The closing page's text, when it was handed over as text (`Engine::on_pull_page_text`):
    /// the adapter places its entries exactly as a staged page's (`place`, `materialize`), after
    /// the staged pages and before `finish`. A row no write of ours touches is then stored as it
    /// came, never decoded into memory, whichever page of the run brought it.
    pub fn take_closing_text(&mut self) -> Option<String> {
        match std::mem::replace(&mut self.closing, ClosingEntries::Decoded(Vec::new())) {
            ClosingEntries::Text(text) => Some(text),
            decoded => {
                self.closing = decoded;
                None
            }
        }
    }

    /// The run's horizon, which becomes the checkpoint's.
    pub fn horizon(&self) -> i64 {
        self.horizon
    }

    /// The store op for one delivered entry, in delivery order: `PutRow` with the server row as
    /// base and the pending writes for its key replayed on top; for a tombstone `DeleteRow`, or
    /// `PutRow` with no base when pending writes still give the row a visible value; `None` for a
    /// tombstone of a row this run delivered live at the same seq (it moved to another requested
    /// bucket). Takes the entry, so its row becomes the record's base without a copy.
    pub fn materialize(&mut self, entry: Entry) -> Option<StoreOp> {
        let key = RowKey::new(entry.table.clone(), entry.pk.clone());
        if !self.note_entry(entry.seq, &key, entry.deleted) {
            return None;
        }
        let base = if entry.deleted { None } else { entry.row };
        let visible = replay(base.as_ref(), self.pending.get(&key).into_iter().flatten());
        let record = RowRecord { table: entry.table, pk: entry.pk, bucket: Some(entry.bucket), base, visible };
        if self.tracked.contains(&key) {
            self.tracked_records.insert(key.clone(), record.clone());
        }
        Some(row_op(record))
    }

    /// What a staged entry becomes, decided from its head alone (its row unread), in delivery
    /// order like `materialize`. A key no write of ours touches gets the server's row as it came
    /// (`Placement::ServerRow`: its record's `base` and what the app sees), so an adapter can
    /// store the row's text as delivered without decoding it; a tracked key needs its row
    /// (`Placement::Replay`: decode it and call `materialize`, which does the bookkeeping).
    pub fn place(&mut self, seq: i64, table: &str, pk: &str, deleted: bool) -> Placement {
        let key = RowKey::new(table, pk);
        if self.tracked.contains(&key) {
            return Placement::Replay;
        }
        match (self.note_entry(seq, &key, deleted), deleted) {
            (false, _) => Placement::Skip,
            (true, true) => Placement::Delete,
            (true, false) => Placement::ServerRow,
        }
    }

    /// The bookkeeping of one delivered entry: the moved-row rule and the change event. False for
    /// a tombstone that only says a row delivered live at the same seq left its old bucket.
    fn note_entry(&mut self, seq: i64, key: &RowKey, deleted: bool) -> bool {
        let moved_here = self.last_live.as_ref().is_some_and(|(s, live)| *s == seq && live == key);
        if deleted && moved_here {
            return false;
        }
        if !deleted {
            self.last_live = Some((seq, key.clone()));
        }
        self.note_changed(key.clone());
        true
    }

    /// Completes the commit: the closing page's rows; on a rehydrate the keys only the outbox
    /// or the dead store still hold (base `None`, pending writes replayed, so unsent edits
    /// stay); the new checkpoint in `PutMeta`; `ClearStaging`; then the events `PullProgress`,
    /// `Change { Remote }` (the delivered keys; after a rehydrate re-render everything),
    /// `Conflicts`, `Checkpoint`, `Rehydrated`.
    pub fn finish(mut self, engine: &mut Engine, now: Millis) -> Transaction {
        let mut tx = Transaction::default();
        if let ClosingEntries::Decoded(entries) = std::mem::replace(&mut self.closing, ClosingEntries::Decoded(Vec::new())) {
            for entry in entries {
                tx.ops.extend(self.materialize(entry));
            }
        }

        if self.rehydrate() {
            for key in self.tracked.clone() {
                if self.tracked_records.contains_key(&key) {
                    continue;
                }
                let mut record = engine.mirrored(&key);
                record.base = None;
                record.visible = replay(None, self.pending.get(&key).into_iter().flatten());
                self.tracked_records.insert(key.clone(), record.clone());
                self.note_changed(key);
                tx.ops.push(row_op(record));
            }
        }

        // Update the mirror. If the outbox moved since the closing page (it should not: see the
        // module docs), re-settle those keys against the live outbox so the last op wins.
        for (key, record) in std::mem::take(&mut self.tracked_records) {
            let snapshot = self.pending.get(&key).cloned().unwrap_or_default();
            let live: Vec<OutboxEntry> = engine.pending_for(&key).cloned().collect();
            if live != snapshot {
                tx.ops.push(engine.settle_row(record));
            } else if engine.is_tracked(&key) {
                engine.rows.insert(key, record);
            }
        }

        let horizon = self.horizon;
        let cursor = self.cursor.clone();
        let rehydrated = self.run.rehydrate.is_some() || self.run.buckets_changed;
        engine.meta.checkpoint =
            Checkpoint { cursor: Some(cursor.clone()), horizon, committed_at: Some(now), buckets: Some(engine.bucket_set()) };
        tx.ops.push(engine.put_meta());
        tx.ops.push(StoreOp::ClearStaging);
        engine.end_run_committed(now);

        // The run is whole: its total is what it delivered, so progress ends at 100%. A run that
        // brought nothing in one page (every poll of an idle app) has no progress to show.
        if self.run.entries > 0 || self.run.pages > 1 {
            tx.events.push(Event::PullProgress { pages: self.run.pages, entries: self.run.entries, total: Some(self.run.entries) });
        }
        if !self.changed.is_empty() || !self.changed_tables.is_empty() {
            tx.events.push(Event::Change {
                keys: self.changed.into_iter().collect(),
                origin: ChangeOrigin::Remote,
                tables: self.changed_tables.into_iter().collect(),
            });
        }
        if !self.run.conflicts.is_empty() {
            tx.events.push(Event::Conflicts(self.run.conflicts));
        }
        tx.events.push(Event::Checkpoint { cursor, horizon });
        if rehydrated {
            tx.events.push(Event::Rehydrated { horizon });
        }
        tx
    }
}
