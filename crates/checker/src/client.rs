//! A real client without a browser: the sans-IO engine driven the way the browser adapter drives it
//! (src/runner.rs), over real HTTP, on an in-memory store, recording what it did and saw.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use kizuna_engine::memory::MemoryStore;
use kizuna_engine::protocol::{PullPage, PushResponse, Reason, Row};
use kizuna_engine::util::{apply_op, replay};
use kizuna_engine::{Config, Engine, Event, LocalWrite, OutboxEntry, PullStep, RowKey, StoreOp, Transaction};
use serde_json::Value;
use uuid::Uuid;

use crate::transport::Transport;

/// The checker's tables: columns ordered by arrival, and by hybrid logical clocks.
pub const TABLES: [&str; 2] = ["hist_items", "hist_notes"];

/// How the history names a row: `table/pk`.
pub fn row_name(table: &str, pk: &str) -> String {
    format!("{table}/{pk}")
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// How a mutation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied at this commit number (`None`: SKIPPED, its commit unknown).
    Applied(Option<i64>),
    Rejected(Reason),
    DeadLettered,
    /// Replaced in the outbox by a newer latest-only write to its key before it was sent.
    Coalesced,
}

/// A committed checkpoint as the client held it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When, in the client's own order of events (see `Client::clock`).
    pub at: u64,
    pub horizon: i64,
    pub buckets: Vec<String>,
    /// The server's part (`base`) of every row of the checker's table.
    pub rows: BTreeMap<String, Value>,
}

pub struct Client {
    pub name: String,
    pub user: String,
    pub config: Config,
    pub engine: Engine,
    pub store: MemoryStore,
    pub transport: Transport,
    seed: u64,
    /// Every mutation this client made, as last stored, by id.
    pub writes: BTreeMap<Uuid, OutboxEntry>,
    pub outcomes: BTreeMap<Uuid, Outcome>,
    /// When each verdict arrived, in the client's own order of events.
    pub answered_at: BTreeMap<Uuid, u64>,
    /// Counts events and snapshots, to order them.
    pub clock: u64,
    pub snapshots: Vec<Snapshot>,
    /// Violations seen while running (read-your-writes at write and commit time, regressions).
    pub violations: Vec<String>,
    /// What happened, line by line with the time in microseconds: writes, mutations sent and
    /// their verdicts, entries pulled, commits, reloads. Printed for the keys of a violation.
    pub trace: Vec<(i64, String)>,
    pub ops: u64,
}

impl Client {
    pub fn new(name: String, user: String, buckets: Vec<String>, transport: Transport, seed: u64) -> Client {
        let config = Config {
            retry_base_ms: 20,
            retry_max_ms: 200,
            pull_limit: 2,
            pull_interval_ms: 200,
            max_slice: 8,
            buckets,
            ..Config::default()
        };
        let state = Engine::fresh_state(Uuid::new_v4());
        let store = MemoryStore::new(&state);
        let engine = Engine::new(config.clone(), state, seed);
        Client {
            name,
            user,
            config,
            engine,
            store,
            transport,
            seed,
            writes: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            answered_at: BTreeMap::new(),
            clock: 0,
            snapshots: Vec::new(),
            violations: Vec::new(),
            trace: Vec::new(),
            ops: 0,
        }
    }

    pub fn note(&mut self, line: String) {
        let micros = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        self.trace.push((micros, format!("{} {line}", self.name)));
    }

    /// A reload: a new engine from what the store holds (with `buckets`, when the app changed them).
    pub fn reload(&mut self, buckets: Option<Vec<String>>) {
        self.note(format!("reload, buckets {:?}", buckets.as_ref().unwrap_or(&self.config.buckets)));
        if let Some(buckets) = buckets {
            self.config.buckets = buckets;
        }
        self.seed = self.seed.wrapping_add(7919);
        let online = self.engine.is_online();
        self.engine = Engine::new(self.config.clone(), self.store.load(), self.seed);
        self.engine.set_online(online);
    }

    /// Applies a transaction to the store, then reads its events into the history.
    fn apply(&mut self, tx: Transaction) {
        for op in &tx.ops {
            match op {
                StoreOp::PutOutbox(entry) => {
                    self.writes.insert(entry.id, entry.clone());
                }
                StoreOp::DeleteOutbox(seq) => {
                    // Deleted with no verdict yet: coalesced away (verdicts arrive as events).
                    let id = self.writes.values().find(|e| e.seq == *seq).map(|e| e.id);
                    if let Some(id) = id {
                        self.outcomes.entry(id).or_insert(Outcome::Coalesced);
                    }
                }
                _ => {}
            }
        }
        let events = tx.events.clone();
        self.store.apply(tx);
        self.store.take_events();
        self.record(events);
    }

    fn record(&mut self, events: Vec<Event>) {
        for event in events {
            match event {
                Event::Applied { id, seq, .. } => {
                    if let (Some(entry), Some(seq)) = (self.writes.get(&id), seq) {
                        if seq <= entry.read_seq {
                            self.violations.push(format!(
                                "{}: write {} committed at {seq}, not after the read watermark {} it was made on",
                                self.name, entry.seq, entry.read_seq
                            ));
                        }
                    }
                    self.outcomes.insert(id, Outcome::Applied(seq));
                    self.clock += 1;
                    self.answered_at.insert(id, self.clock);
                }
                Event::Rejected { mutation, reason, .. } => {
                    self.outcomes.insert(mutation.id, Outcome::Rejected(reason));
                }
                Event::DeadLetter { entry, .. } => {
                    self.outcomes.insert(entry.id, Outcome::DeadLettered);
                    // The app discards it: a poisoned write stays poisoned.
                    if let Ok(tx) = self.engine.discard_dead(entry.seq) {
                        self.store.apply(tx);
                        self.store.take_events();
                    }
                }
                _ => {}
            }
        }
    }

    fn visible(&self, table: &str, pk: &str) -> Option<Row> {
        self.store.rows.get(&RowKey::new(table, pk)).and_then(|r| r.visible.clone())
    }

    /// Local writes as one call (several: one atomic batch); checks read-your-writes at once.
    pub fn write(&mut self, writes: Vec<LocalWrite>) {
        self.ops += writes.len() as u64;
        for w in &writes {
            let columns = w.columns.as_ref().map(|c| {
                let mut c = c.clone();
                c.values_mut().filter(|v| v.as_str().is_some_and(|s| s.len() > 64)).for_each(|v| *v = Value::from("<long>"));
                c
            });
            self.note(format!("write {} {:?} {columns:?} apply_after {:?} latest_only {:?}", w.pk, w.op, w.apply_after, w.latest_only));
        }
        let mut expected: BTreeMap<(String, String), Option<Row>> = BTreeMap::new();
        for w in &writes {
            let key = (w.table.clone(), w.pk.clone());
            let before = expected.get(&key).cloned().unwrap_or_else(|| self.visible(&w.table, &w.pk));
            expected.insert(key, apply_op(before, w.op, w.columns.as_ref()));
        }
        let current = self.store.current(&writes);
        match self.engine.write(now_ms(), writes, &current) {
            Ok(tx) => self.apply(tx),
            Err(e) => {
                self.violations.push(format!("{}: a valid write was refused locally: {e}", self.name));
                return;
            }
        }
        for ((table, pk), want) in expected {
            let seen = self.visible(&table, &pk);
            if seen != want {
                self.violations.push(format!("{}: read-your-writes: {pk} shows {seen:?} right after writing {want:?}", self.name));
            }
        }
    }

    /// One push request if one is due; true when one was sent.
    pub async fn push(&mut self) -> bool {
        let Some((request, tx)) = self.engine.poll_push(now_ms()) else { return false };
        self.apply(tx);
        let result = self.transport.rpc::<_, PushResponse>("kizuna_push", &request).await;
        for m in &request.mutations {
            let verdict = result.as_ref().ok().and_then(|r| r.verdicts.iter().find(|v| v.id == m.id));
            let answer = match (verdict, &result) {
                (Some(v), _) => format!("{:?} {:?} seq {:?} bucket {:?} replayed {}", v.status, v.reason, v.seq, v.bucket, v.replayed),
                (None, Err(f)) => format!("failed {}", f.describe()),
                (None, Ok(_)) => "no verdict".into(),
            };
            self.note(format!("sent {} (client_seq {}, batch {:?}) -> {answer}", m.pk, m.client_seq, m.batch.is_some()));
        }
        let tx = match result {
            Ok(response) => self.engine.on_push_response(now_ms(), response),
            Err(failure) => self.engine.on_push_failure(now_ms(), failure),
        };
        self.apply(tx);
        true
    }

    /// A push whose tab goes away while it is on the wire: sent, its answer never read, then a
    /// reload. The server may have applied it; only the replayed verdict may retire it.
    pub async fn push_then_reload(&mut self) {
        if let Some((request, tx)) = self.engine.poll_push(now_ms()) {
            self.apply(tx);
            let _ = self.transport.rpc::<_, PushResponse>("kizuna_push", &request).await;
        }
        self.reload(None);
    }

    /// One whole pull run if one is due, committed as the adapter commits it.
    pub async fn pull(&mut self) -> bool {
        let Some(mut request) = self.engine.poll_pull(now_ms()) else { return false };
        loop {
            let page = match self.transport.rpc::<_, PullPage>("kizuna_pull", &request).await {
                Ok(page) => page,
                Err(failure) => {
                    let tx = self.engine.on_pull_failure(now_ms(), failure);
                    self.apply(tx);
                    return true;
                }
            };
            for e in &page.entries {
                self.note(format!("pulled {} seq {} bucket {} {}", e.pk, e.seq, e.bucket, if e.deleted { "deleted" } else { "live" }));
            }
            if page.done || page.lifecycle.is_some() {
                self.note(format!("page done {} horizon {} lifecycle {:?}", page.done, page.horizon, page.lifecycle));
            }
            match self.engine.on_pull_page(now_ms(), page) {
                PullStep::Stage { tx, next } | PullStep::Restart { tx, next } => {
                    self.apply(tx);
                    request = next;
                }
                PullStep::Commit(plan) => {
                    let before = self.engine.checkpoint().horizon;
                    let mut store = std::mem::take(&mut self.store);
                    store.commit(plan, &mut self.engine, now_ms());
                    let events = store.take_events();
                    self.store = store;
                    self.record(events);
                    self.committed(before);
                    return true;
                }
                PullStep::Abandoned { tx } => {
                    self.apply(tx);
                    return true;
                }
            }
        }
    }

    /// After a commit: the read position never regresses, pending writes stay on screen over the
    /// new snapshot, and the snapshot is kept for the checkpoint check.
    fn committed(&mut self, before: i64) {
        let horizon = self.engine.checkpoint().horizon;
        if horizon < before {
            self.violations.push(format!("{}: the checkpoint went back from {before} to {horizon}", self.name));
        }
        let mut rows = BTreeMap::new();
        for record in self.store.rows.values().filter(|r| TABLES.contains(&r.table.as_str())) {
            let pending: Vec<&OutboxEntry> = self.store.outbox.values().filter(|e| e.is_for(&record.key())).collect();
            let want = replay(record.base.as_ref(), pending);
            if record.visible != want {
                self.violations.push(format!(
                    "{}: {} shows {:?} over checkpoint {horizon}, not its pending writes replayed ({want:?})",
                    self.name, record.pk, record.visible
                ));
            }
            if let Some(base) = &record.base {
                rows.insert(row_name(&record.table, &record.pk), Value::Object(base.clone()));
            }
        }
        let mut buckets = self.config.buckets.clone();
        buckets.sort();
        self.clock += 1;
        self.snapshots.push(Snapshot { at: self.clock, horizon, buckets, rows });
    }

    /// One round of work: a push if due, then a pull if due. True when anything went out.
    pub async fn step(&mut self) -> bool {
        let pushed = self.push().await;
        let pulled = self.pull().await;
        pushed || pulled
    }

    /// Nothing left to send and nothing dead: every write has its answer.
    pub fn settled(&self) -> bool {
        self.engine.status().pending == 0 && self.engine.dead_letters().is_empty()
    }

    /// The visible rows of the checker's tables, by `table/pk`.
    pub fn visible_rows(&self) -> BTreeMap<String, Value> {
        self.store
            .rows
            .values()
            .filter(|r| TABLES.contains(&r.table.as_str()))
            .filter_map(|r| r.visible.clone().map(|v| (row_name(&r.table, &r.pk), Value::Object(v))))
            .collect()
    }
}
