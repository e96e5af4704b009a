//! An in-memory store that stands where the browser adapter's IndexedDB stands: it applies each
//! [`Transaction`]'s ops in order, keeps the events, loads a [`PersistedState`] back the way the
//! adapter does at start, and runs a [`CommitPlan`] the way the adapter does in one IndexedDB
//! transaction. For native adapters (the history checker drives real clients with it against the
//! real server) and for the engine's own tests.

use std::collections::BTreeMap;

use kizuna_protocol::{Entry, PullPage};

use crate::commit::{CommitPlan, Placement};
use crate::engine::Engine;
use crate::rebase::row_op;
use crate::inputs::LocalWrite;
use crate::records::{DeadLetter, Meta, Millis, OutboxEntry, PersistedState, RowKey, RowRecord};
use crate::transaction::{Event, StoreOp, Transaction};

/// The five stores of the adapter, in memory.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    /// `rows`, by key.
    pub rows: BTreeMap<RowKey, RowRecord>,
    /// `outbox`, by seq.
    pub outbox: BTreeMap<i64, OutboxEntry>,
    /// `dead`, by the entry's seq.
    pub dead: BTreeMap<i64, DeadLetter>,
    /// `staging`, by page number.
    pub staging: BTreeMap<u32, PullPage>,
    /// `meta`.
    pub meta: Option<Meta>,
    /// Events of applied transactions, not yet taken.
    pub events: Vec<Event>,
}

impl MemoryStore {
    /// A store holding a fresh engine's meta.
    pub fn new(state: &PersistedState) -> MemoryStore {
        MemoryStore { meta: Some(state.meta.clone()), ..MemoryStore::default() }
    }

    /// Applies a transaction's ops in order and keeps its events.
    pub fn apply(&mut self, tx: Transaction) {
        for op in tx.ops {
            self.apply_op(op);
        }
        self.events.extend(tx.events);
    }

    /// Applies one op.
    pub fn apply_op(&mut self, op: StoreOp) {
        match op {
            StoreOp::PutRow(r) => {
                self.rows.insert(r.key(), r);
            }
            StoreOp::DeleteRow(k) => {
                self.rows.remove(&k);
            }
            StoreOp::PutOutbox(e) => {
                self.outbox.insert(e.seq, e);
            }
            StoreOp::DeleteOutbox(s) => {
                self.outbox.remove(&s);
            }
            StoreOp::PutDead(d) => {
                self.dead.insert(d.entry.seq, d);
            }
            StoreOp::DeleteDead(s) => {
                self.dead.remove(&s);
            }
            StoreOp::PutMeta(m) => self.meta = Some(m),
            StoreOp::PutStaging { page_no, page } => {
                self.staging.insert(page_no, page);
            }
            StoreOp::PutStagingText { page_no, text } => {
                // Kept decoded: the text is a page an adapter read before handing it over.
                let page = serde_json::from_str(&text).expect("a staged page's text is a page");
                self.staging.insert(page_no, page);
            }
            StoreOp::ClearStaging => self.staging.clear(),
            StoreOp::ClearRows => self.rows.clear(),
        }
    }

    /// What the adapter reads at start: meta, outbox, dead, and the rows of tracked keys.
    pub fn load(&self) -> PersistedState {
        let outbox: Vec<OutboxEntry> = self.outbox.values().cloned().collect();
        let dead: Vec<DeadLetter> = self.dead.values().cloned().collect();
        let rows = PersistedState::tracked_keys(&outbox, &dead)
            .into_iter()
            .filter_map(|k| self.rows.get(&k).cloned())
            .collect();
        PersistedState { meta: self.meta.clone().expect("meta"), outbox, dead, rows }
    }

    /// The stored records of the keys `writes` touch: what `Engine::write` needs as `current`.
    pub fn current(&self, writes: &[LocalWrite]) -> BTreeMap<RowKey, RowRecord> {
        writes
            .iter()
            .filter_map(|w| {
                let k = RowKey::new(w.table.clone(), w.pk.clone());
                self.rows.get(&k).map(|r| (k, r.clone()))
            })
            .collect()
    }

    /// Runs a commit plan as one IndexedDB transaction would: staged pages read back one at a
    /// time, then the plan's closing transaction.
    pub fn commit(&mut self, mut plan: CommitPlan, engine: &mut Engine, now: Millis) {
        if plan.rehydrate() {
            // As the adapter does: the rows of pending writes, read before they are cleared.
            let keys = engine.tracked_keys();
            engine.remember(&keys, &self.rows_of(&keys));
            self.apply_op(StoreOp::ClearRows);
        }
        for page_no in 0..plan.staged_pages() {
            let page = self.staging[&page_no].clone();
            self.place_entries(&mut plan, page.entries);
        }
        if let Some(text) = plan.take_closing_text() {
            let page: PullPage = serde_json::from_str(&text).expect("a closing page's text is a page");
            self.place_entries(&mut plan, page.entries);
        }
        let tx = plan.finish(engine, now);
        self.apply(tx);
    }

    /// A page's entries as the adapter writes a page it holds as text: a key no write of ours
    /// touches takes the row as delivered; the others go through the plan.
    fn place_entries(&mut self, plan: &mut CommitPlan, entries: Vec<Entry>) {
        for entry in entries {
            let op = match plan.place(entry.seq, &entry.table, &entry.pk, entry.deleted) {
                Placement::Replay => plan.materialize(entry),
                Placement::Skip => None,
                Placement::Delete => Some(StoreOp::DeleteRow(RowKey::new(entry.table, entry.pk))),
                Placement::ServerRow => Some(row_op(RowRecord {
                    table: entry.table,
                    pk: entry.pk,
                    bucket: Some(entry.bucket),
                    base: entry.row.clone(),
                    visible: entry.row,
                })),
            };
            if let Some(op) = op {
                self.apply_op(op);
            }
        }
    }

    /// The stored records of `keys` that exist: what a step that may touch them reads.
    pub fn rows_of(&self, keys: &[RowKey]) -> BTreeMap<RowKey, RowRecord> {
        keys.iter().filter_map(|k| self.rows.get(k).map(|r| (k.clone(), r.clone()))).collect()
    }

    /// What the browser adapter loads at start: the state without the rows of tracked keys, which
    /// the steps read when they need them (see `Engine::remember`).
    pub fn load_cold(&self) -> PersistedState {
        PersistedState { rows: Vec::new(), ..self.load() }
    }

    /// The visible row of a key, as JSON.
    pub fn visible(&self, table: &str, pk: &str) -> Option<serde_json::Value> {
        self.rows.get(&RowKey::new(table, pk)).and_then(|r| r.visible.clone()).map(serde_json::Value::Object)
    }

    /// The events applied so far, taken.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}
