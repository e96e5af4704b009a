//! A stand-in for the adapter's IndexedDB: applies each Transaction's ops in order, keeps the
//! events, and loads a PersistedState back the way the adapter does at start.

use std::collections::BTreeMap;

use kizuna_engine::protocol::PullPage;
use kizuna_engine::{DeadLetter, Event, Meta, OutboxEntry, PersistedState, RowKey, RowRecord, StoreOp, Transaction};

#[derive(Debug, Default, Clone)]
pub struct SimStore {
    pub rows: BTreeMap<RowKey, RowRecord>,
    pub outbox: BTreeMap<i64, OutboxEntry>,
    pub dead: BTreeMap<i64, DeadLetter>,
    pub staging: BTreeMap<u32, PullPage>,
    pub meta: Option<Meta>,
    pub events: Vec<Event>,
}

impl SimStore {
    pub fn new(state: &PersistedState) -> SimStore {
        SimStore { meta: Some(state.meta.clone()), ..SimStore::default() }
    }

    pub fn apply(&mut self, tx: Transaction) {
        for op in tx.ops {
            self.apply_op(op);
        }
        self.events.extend(tx.events);
    }

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

    pub fn visible(&self, table: &str, pk: &str) -> Option<serde_json::Value> {
        self.rows.get(&RowKey::new(table, pk)).and_then(|r| r.visible.clone()).map(serde_json::Value::Object)
    }

    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}
