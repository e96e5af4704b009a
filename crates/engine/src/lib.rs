//! Kizuna's sans-IO sync engine: the policy core of the browser client.
//!
//! In the style of quinn-proto and str0m, the engine owns no clock, network, storage or
//! entropy. The adapter feeds it inputs (local writes, push responses and failures, pull pages
//! and failures, wake-ups) with `now` in unix milliseconds on every call, and carries out what
//! it returns: requests to send, [`Transaction`]s (store operations to persist in ONE
//! IndexedDB transaction, then events to emit) and the next time to wake.
//!
//! ## Driving it
//! * Start: read `meta`, `outbox` and `dead` into a [`PersistedState`] (or
//!   [`Engine::fresh_state`]), then [`Engine::new`]. The `rows` of pending writes need not be read
//!   at start: before a step that recomputes rows, read the records of the keys it may touch in
//!   that step's transaction and pass them to [`Engine::remember`] (the keys of a push answer or
//!   failure: [`Engine::in_flight_keys`]; of requeuing or discarding a dead letter:
//!   [`Engine::dead_group_keys`]; of a rehydrating commit, before its `ClearRows`:
//!   [`Engine::tracked_keys`]).
//! * Writes: [`Engine::write`] inside the IndexedDB transaction that read `current`.
//! * Push: [`Engine::poll_push`] → persist its transaction → send → [`Engine::on_push_response`]
//!   or [`Engine::on_push_failure`] → persist. Call `poll_push` again right away: after a
//!   narrowing it returns the narrower slice at once. Once an answer's status says success (its
//!   writes committed) and before its body is read, [`Engine::poll_push_ahead`] may give the
//!   next slice to send at once; answers are then handed over in the order the requests went.
//! * Pull: [`Engine::poll_pull`] → send → [`Engine::on_pull_page`] (or
//!   [`Engine::on_pull_page_text`], the page's rows left as text) → follow the [`PullStep`]
//!   until `Commit`, then run the [`CommitPlan`] (see `commit.rs`).
//! * Timers: sleep until [`Engine::next_wake`], or until a response, a wake-up or a write.
//! * Apply transactions in the order they were returned, and serialize engine calls with
//!   their transactions: the engine mirrors the rows of keys with pending writes and assumes
//!   the store holds what it returned. If a transaction fails to apply, rebuild the engine
//!   from storage and tell it with [`Engine::after_storage_failure`], so requests wait out a
//!   backoff instead of repeating the step that failed at once.
//!
//! ## Files
//! `records.rs` (persisted types), `transaction.rs` (ops and events), `config.rs`,
//! `inputs.rs`, `status.rs`, `engine.rs` (state, shared bookkeeping), `outbox.rs` (local
//! writes, coalescing), `delivery.rs` (issue order, slices), `verdicts.rs`,
//! `push_failures.rs` (retry, budget, narrowing), `dead_letters.rs`, `outbox_policy.rs` (the rules of
//! attempts, backoff, dead letters and delivery order, shared with universe sync: `universe.rs`), `pull.rs`, `commit.rs`,
//! `rebase.rs`, `schedule.rs`, `backoff.rs`, `hlc.rs`, `prng.rs`, `wire_time.rs`; `order.rs` (the one
//! sort, for the adapter too); `memory.rs`, an in-memory store for native adapters and tests.

#![warn(missing_docs)]

mod backoff;
mod commit;
mod config;
mod dead_letters;
mod delivery;
mod push_failures;
mod engine;
mod hlc;
mod inputs;
pub mod memory;
pub mod order;
mod outbox;
mod pending;
pub mod outbox_policy;
mod prng;
mod pull;
mod rebase;
mod records;
mod schedule;
mod status;
mod transaction;
pub mod universe;
mod verdicts;
mod wire_time;

pub use commit::{CommitPlan, Placement, LISTED_CHANGES};
pub use config::Config;
pub use engine::Engine;
pub use inputs::{EngineError, Failure, LocalWrite};
pub use pull::{PageHead, PullStep};
pub use records::{Checkpoint, Counters, DeadLetter, Meta, Millis, OutboxEntry, PersistedState, RowKey, RowRecord};
pub use status::{Health, Status};
pub use transaction::{ChangeOrigin, Event, StoreOp, Transaction};

/// Pure helpers the adapter (and tests) may reuse.
pub mod util {
    pub use crate::backoff::{ceiling as backoff_ceiling, delay as backoff_delay};
    pub use crate::hlc::{next_hlc, parse as parse_hlc};
    pub use crate::prng::Prng;
    pub use crate::rebase::{apply_op, replay};
    pub use crate::wire_time::rfc3339;
}

/// The wire types, re-exported so an adapter needs only this crate.
pub use kizuna_protocol as protocol;
