//! A real client without a browser: the sans-IO engine driven the way the browser adapter drives it
//! (src/runner.rs), over real HTTP through its own faulty network (proxy.rs), on an in-memory
//! store, recording what it did and saw.

use std::collections::BTreeMap;

use kizuna_engine::memory::MemoryStore;
use kizuna_engine::protocol::{PullPage, PushResponse, Row};
use kizuna_engine::util::{apply_op, replay};
use kizuna_engine::{Config, Engine, Event, LocalWrite, OutboxEntry, PullStep, RowKey, StoreOp, Transaction};
use serde_json::Value;
use uuid::Uuid;

use crate::plan::TABLES;
use crate::proxy::Proxy;
use crate::record::{now_ms, row_name, Outcome, Read, Record};
use crate::transport::Transport;

/// The engine's settings in every history: short backoffs and pages of two entries, so a history
/// of seconds meets retries, dead letters and multi-page runs.
pub fn config(buckets: Vec<String>) -> Config {
    Config { retry_base_ms: 20, retry_max_ms: 200, pull_limit: 2, pull_interval_ms: 200, max_slice: 8, buckets, ..Config::default() }
}

pub struct Client {
    pub rec: Record,
    pub config: Config,
    pub engine: Engine,
    pub store: MemoryStore,
    pub proxy: Proxy,
    transport: Transport,
    seed: u64,
}

impl Client {
    pub fn new(name: String, user: String, buckets: Vec<String>, proxy: Proxy, seed: u64) -> Client {
        let config = config(buckets.clone());
        let state = Engine::fresh_state(Uuid::new_v4());
        let store = MemoryStore::new(&state);
        let engine = Engine::new(config.clone(), state, seed);
        let transport = Transport::new(proxy.url(), &user);
        Client { rec: Record::new(name, user, buckets), config, engine, store, proxy, transport, seed }
    }

    /// A reload: a new engine from what the store holds (with `buckets`, when the app changed them).
    pub fn reload(&mut self, buckets: Option<Vec<String>>) {
        self.rec.note(format!("reload, buckets {:?}", buckets.as_ref().unwrap_or(&self.config.buckets)));
        if let Some(buckets) = buckets {
            self.config.buckets = buckets.clone();
            self.rec.buckets = buckets;
        }
        self.seed = self.seed.wrapping_add(7919);
        let online = self.engine.is_online();
        self.engine = Engine::new(self.config.clone(), self.store.load_cold(), self.seed);
        self.engine.set_online(online);
    }

    /// Applies a transaction to the store, then reads its events into the history.
    fn apply(&mut self, tx: Transaction) {
        for op in &tx.ops {
            match op {
                StoreOp::PutOutbox(entry) => {
                    self.rec.writes.insert(entry.id, entry.clone());
                }
                StoreOp::DeleteOutbox(seq) => {
                    // Deleted with no verdict yet: coalesced away (verdicts arrive as events).
                    let id = self.rec.writes.values().find(|e| e.seq == *seq).map(|e| e.id);
                    if let Some(id) = id {
                        self.rec.outcomes.entry(id).or_insert(Outcome::Coalesced);
                    }
                }
                _ => {}
            }
        }
        let events = tx.events.clone();
        self.store.apply(tx);
        self.store.take_events();
        self.hear(events);
    }

    fn hear(&mut self, events: Vec<Event>) {
        for event in events {
            match event {
                Event::Applied { id, seq, bucket, .. } => self.rec.applied(self.next(), id, seq, bucket, None),
                Event::Rejected { mutation, reason, server_row, .. } => self.rec.rejected(self.next(), &mutation, reason, server_row, None),
                Event::DeadLetter { entry, .. } => {
                    self.rec.outcomes.insert(entry.id, Outcome::DeadLettered);
                    // The app discards it: a poisoned write stays poisoned.
                    let keys = self.engine.dead_group_keys(entry.seq);
                    self.engine.remember(&keys, &self.store.rows_of(&keys));
                    if let Ok(tx) = self.engine.discard_dead(entry.seq) {
                        self.store.apply(tx);
                        self.store.take_events();
                    }
                }
                _ => {}
            }
        }
    }

    /// The next moment of this client (one page: what it heard, numbered in order).
    fn next(&self) -> crate::record::At {
        (0, self.rec.heard.len() as u64)
    }

    fn visible(&self, table: &str, pk: &str) -> Option<Row> {
        self.store.rows.get(&RowKey::new(table, pk)).and_then(|r| r.visible.clone())
    }

    /// Local writes as one call (several: one atomic batch); checks read-your-writes at once.
    pub fn write(&mut self, writes: Vec<LocalWrite>) {
        self.rec.ops += writes.len() as u64;
        for w in &writes {
            self.rec.note(describe_write(w));
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
                self.rec.violations.push(format!("{}: a valid write was refused locally: {e}", self.rec.name));
                return;
            }
        }
        for ((table, pk), want) in expected {
            let seen = self.visible(&table, &pk);
            if seen != want {
                self.rec.violations.push(format!("{}: read-your-writes: {pk} shows {seen:?} right after writing {want:?}", self.rec.name));
            }
        }
    }

    /// One push request if one is due; true when one was sent. As the browser adapter does, once
    /// its answer's status says success (its writes are committed), the next due slice goes before
    /// the answer is read (`Engine::poll_push_ahead`), and the answers are taken in order.
    pub async fn push(&mut self) -> bool {
        let Some((request, tx)) = self.engine.poll_push(now_ms()) else { return false };
        self.apply(tx);
        let headed = self.transport.send("kizuna_push", &request).await;
        let ahead = match &headed {
            Ok(response) if response.status().is_success() => self.engine.poll_push_ahead(now_ms()),
            _ => None,
        };
        let ahead_headed = match &ahead {
            Some(next) => Some(self.transport.send("kizuna_push", next).await),
            None => None,
        };
        let failed = !self.take_push_answer(&request, Transport::read(headed).await);
        if let (Some(next), Some(headed)) = (ahead, ahead_headed) {
            let result = Transport::read::<PushResponse>(headed).await;
            if failed {
                // The engine let this answer go with the failure before it; its writes go again.
                for m in &next.mutations {
                    self.rec.note(format!("sent {} (client_seq {}) ahead -> answer let go after the failure before it", m.pk, m.client_seq));
                }
            } else {
                self.take_push_answer(&next, result);
            }
        }
        true
    }

    /// Hands a push's answer (or failure) to the engine, as the adapter's step does; false for a failure.
    fn take_push_answer(&mut self, request: &kizuna_engine::protocol::PushRequest, result: Result<PushResponse, kizuna_engine::Failure>) -> bool {
        for m in &request.mutations {
            let verdict = result.as_ref().ok().and_then(|r| r.verdicts.iter().find(|v| v.id == m.id));
            let answer = match (verdict, &result) {
                (Some(v), _) => format!("{:?} {:?} seq {:?} bucket {:?} replayed {}", v.status, v.reason, v.seq, v.bucket, v.replayed),
                (None, Err(f)) => format!("failed {}", f.describe()),
                (None, Ok(_)) => "no verdict".into(),
            };
            self.rec.note(format!("sent {} (client_seq {}, batch {:?}) -> {answer}", m.pk, m.client_seq, m.batch.is_some()));
        }
        // As the adapter does: the rows the answer settles, read in its step.
        let keys = self.engine.in_flight_keys();
        self.engine.remember(&keys, &self.store.rows_of(&keys));
        if let Ok(response) = &result {
            let respelled = self.engine.respelled_keys(response);
            self.engine.remember_respelled(&respelled, &self.store.rows_of(&respelled));
        }
        let ok = result.is_ok();
        let tx = match result {
            Ok(response) => self.engine.on_push_response(now_ms(), response),
            Err(failure) => self.engine.on_push_failure(now_ms(), failure),
        };
        self.apply(tx);
        ok
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
                self.rec.note(format!("pulled {} seq {} bucket {} {}", e.pk, e.seq, e.bucket, if e.deleted { "deleted" } else { "live" }));
            }
            if page.done || page.lifecycle.is_some() {
                self.rec.note(format!("page done {} horizon {} lifecycle {:?}", page.done, page.horizon, page.lifecycle));
            }
            match self.engine.on_pull_page(now_ms(), page) {
                PullStep::Stage { tx, next } | PullStep::Restart { tx, next } => {
                    self.apply(tx);
                    request = next;
                }
                PullStep::Commit(plan) => {
                    let mut store = std::mem::take(&mut self.store);
                    store.commit(plan, &mut self.engine, now_ms());
                    let events = store.take_events();
                    self.store = store;
                    self.hear(events);
                    self.committed();
                    return true;
                }
                PullStep::Abandoned { tx } => {
                    self.apply(tx);
                    return true;
                }
            }
        }
    }

    /// After a commit: every row shows its base with its pending writes replayed (the engine's
    /// own bookkeeping, seen from the store), and the commit is a read the checks judge.
    fn committed(&mut self) {
        let horizon = self.engine.checkpoint().horizon;
        for record in self.store.rows.values().filter(|r| TABLES.contains(&r.table.as_str())) {
            let pending: Vec<&OutboxEntry> = self.store.outbox.values().filter(|e| e.is_for(&record.key())).collect();
            let want = replay(record.base.as_ref(), pending);
            if record.visible != want {
                self.rec.violations.push(format!(
                    "{}: {} shows {:?} over checkpoint {horizon}, not its pending writes replayed ({want:?})",
                    self.rec.name, record.pk, record.visible
                ));
            }
        }
        self.rec.note(format!("committed horizon {horizon}"));
        self.rec.committed(self.next(), horizon);
        self.read();
    }

    /// Reads everything the client shows, as an app would, into the history.
    pub fn read(&mut self) {
        let rows = self
            .store
            .rows
            .values()
            .filter(|r| TABLES.contains(&r.table.as_str()))
            .filter_map(|r| r.visible.clone().map(|v| (row_name(&r.table, &r.pk), Value::Object(v))))
            .collect();
        let read = Read {
            at: self.next(),
            horizon: self.engine.checkpoint().horizon,
            checkpoint_buckets: self.engine.checkpoint().buckets.clone().unwrap_or_else(|| self.config.buckets.clone()),
            buckets: self.config.buckets.clone(),
            rows,
            pending: self.store.outbox.values().cloned().collect(),
        };
        self.rec.reads.push(read);
    }

    /// One round of work: a push if due, then a pull if due. True when anything went out.
    pub async fn step(&mut self) -> bool {
        let pushed = self.push().await;
        let pulled = self.pull().await;
        pushed || pulled
    }
}

/// A write as a line of the trace (long values shortened).
pub fn describe_write(w: &LocalWrite) -> String {
    let columns = w.columns.as_ref().map(|c| {
        let mut c = c.clone();
        c.values_mut().filter(|v| v.as_str().is_some_and(|s| s.len() > 64)).for_each(|v| *v = Value::from("<long>"));
        c
    });
    format!("write {} {:?} {columns:?} apply_after {:?} latest_only {:?}", w.pk, w.op, w.apply_after, w.latest_only)
}
