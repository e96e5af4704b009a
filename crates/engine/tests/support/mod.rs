//! Test support: a simulated store and server, and a harness that drives the engine the way
//! the browser adapter does, on synthetic time.
#![allow(dead_code)]

pub mod server;

use kizuna_engine::protocol::{Op, PullPage, Row};
use kizuna_engine::{Config, Engine, EngineError, Event, LocalWrite, PullStep};
pub use server::SimServer;
pub use kizuna_engine::memory::MemoryStore as SimStore;
use serde_json::Value;
use uuid::Uuid;

pub const T0: i64 = 1_700_000_000_000;

pub fn row(v: Value) -> Row {
    v.as_object().expect("object").clone()
}

pub fn lw(table: &str, pk: &str, op: Op, columns: Option<Value>) -> LocalWrite {
    LocalWrite { table: table.into(), pk: pk.into(), op, columns: columns.map(row), apply_after: None, latest_only: None }
}

pub struct Harness {
    pub engine: Engine,
    pub store: SimStore,
    pub server: SimServer,
    pub config: Config,
    pub now: i64,
    pub seed: u64,
}

impl Harness {
    pub fn new(config: Config) -> Harness {
        Harness::with_seed(config, 42)
    }

    pub fn with_seed(config: Config, seed: u64) -> Harness {
        let state = Engine::fresh_state(Uuid::from_u128(0x6b697a756e61_u128 + seed as u128));
        let store = SimStore::new(&state);
        let engine = Engine::new(config.clone(), state, seed);
        Harness { engine, store, server: SimServer::new(), config, now: T0, seed }
    }

    /// The tab reloads: a new engine from what the store holds.
    pub fn reload(&mut self) {
        self.seed = self.seed.wrapping_add(1000);
        self.engine = Engine::new(self.config.clone(), self.store.load(), self.seed);
    }

    pub fn write_all(&mut self, writes: Vec<LocalWrite>) -> Result<(), EngineError> {
        let current = self.store.current(&writes);
        let tx = self.engine.write(self.now, writes, &current)?;
        self.store.apply(tx);
        Ok(())
    }

    pub fn write(&mut self, table: &str, pk: &str, op: Op, columns: Option<Value>) {
        self.write_all(vec![lw(table, pk, op, columns)]).expect("valid write");
    }

    /// One push request if one is due; true when something was sent.
    pub fn push_step(&mut self) -> bool {
        let Some((request, tx)) = self.engine.poll_push(self.now) else { return false };
        self.store.apply(tx);
        let tx = match self.server.push(self.now, request) {
            Ok(response) => self.engine.on_push_response(self.now, response),
            Err(failure) => self.engine.on_push_failure(self.now, failure),
        };
        self.store.apply(tx);
        true
    }

    /// One whole pull run if one is due, the way the adapter commits it. True when a run ran.
    pub fn pull_step(&mut self) -> bool {
        self.pull_step_with(|engine, now, page| engine.on_pull_page(now, page))
    }

    /// `pull_step`, each page handed to the engine by `feed`.
    pub fn pull_step_with(&mut self, mut feed: impl FnMut(&mut Engine, i64, PullPage) -> PullStep) -> bool {
        let Some(mut request) = self.engine.poll_pull(self.now) else { return false };
        loop {
            let page = self.server.pull(&request);
            match feed(&mut self.engine, self.now, page) {
                PullStep::Stage { tx, next } | PullStep::Restart { tx, next } => {
                    self.store.apply(tx);
                    request = next;
                }
                PullStep::Commit(plan) => {
                    self.commit(plan);
                    return true;
                }
                PullStep::Abandoned { tx } => {
                    self.store.apply(tx);
                    return true;
                }
            }
        }
    }

    /// Executes a commit plan as the adapter does.
    pub fn commit(&mut self, plan: kizuna_engine::CommitPlan) {
        self.store.commit(plan, &mut self.engine, self.now);
    }

    /// Drives pushes and pulls on synthetic time until `done` holds or time runs out.
    pub fn run_until(&mut self, limit_ms: i64, mut done: impl FnMut(&Harness) -> bool) {
        let deadline = self.now + limit_ms;
        while !done(self) {
            if self.push_step() || self.pull_step() {
                continue;
            }
            match self.engine.next_wake(self.now) {
                Some(at) if at <= deadline => self.now = at.max(self.now + 1),
                _ => break,
            }
        }
    }

    /// Until the outbox is empty.
    pub fn drain(&mut self, limit_ms: i64) {
        self.run_until(limit_ms, |h| h.engine.status().pending == 0);
        assert_eq!(self.engine.status().pending, 0, "outbox did not drain within {limit_ms} ms");
    }

    pub fn events(&mut self) -> Vec<Event> {
        self.store.take_events()
    }
}
