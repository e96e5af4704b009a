//! The engine's state and the bookkeeping every rule shares: the row mirror, meta, health.
//!
//! The rules themselves live beside it, each in its own file as `impl Engine` blocks:
//! `outbox.rs` (local writes, coalescing), `delivery.rs`, `verdicts.rs` and
//! `push_failures.rs` (push), `dead_letters.rs`,
//! `pull.rs` and `commit.rs` (pull runs and checkpoints), `schedule.rs` (when to wake).

use std::collections::BTreeMap;

use crate::config::Config;
use crate::delivery::PushState;
use crate::order;
use crate::pending::Outbox;
use crate::prng::{Prng, mix_seed};
use crate::pull::PullState;
use crate::rebase::{replay, row_op};
use crate::records::{Checkpoint, Counters, DeadLetter, Meta, Millis, OutboxEntry, PersistedState, RowKey, RowRecord};
use crate::status::{Health, Status};
use crate::transaction::StoreOp;
use uuid::Uuid;

/// The sans-IO sync engine. See the crate docs for how an adapter drives it.
#[derive(Debug)]
pub struct Engine {
    pub(crate) config: Config,
    pub(crate) meta: Meta,
    /// Live entries by `seq` (issue order), and by key.
    pub(crate) outbox: Outbox,
    /// Dead letters, sorted by `entry.seq`.
    pub(crate) dead: Vec<DeadLetter>,
    /// The `rows` records of tracked keys (keys with an outbox or dead entry) this engine was
    /// given, so a verdict or dead letter can recompute `visible` from `base`. The adapter need not
    /// load them at start: before a step it hands over the records of the keys that step may touch
    /// ([`Engine::remember`], with the keys from [`Engine::in_flight_keys`], [`Engine::dead_group_keys`]
    /// or, for a rehydrating commit, [`Engine::tracked_keys`]).
    pub(crate) rows: BTreeMap<RowKey, RowRecord>,
    /// The stored records of the keys the answer in hand moves rows to (a verdict's `pk`), read in
    /// its step ([`Engine::respelled_keys`], [`Engine::remember_respelled`]); emptied by the answer.
    pub(crate) respelled: BTreeMap<RowKey, RowRecord>,
    pub(crate) prng: Prng,
    pub(crate) push: PushState,
    pub(crate) pull: PullState,
    pub(crate) health: HealthState,
    pub(crate) online: bool,
}

/// Request outcomes behind [`Health`]. The failure streak itself is derived from the push and
/// pull streaks, so a pull that succeeds does not hide a push that keeps failing.
#[derive(Debug, Default)]
pub(crate) struct HealthState {
    pub last_error: Option<String>,
    pub last_success_at: Option<Millis>,
    /// Consecutive steps the store refused (see [`Engine::after_storage_failure`]).
    pub storage_failures: u32,
    /// No request goes out before this time, after a store failure.
    pub storage_hold_until: Option<Millis>,
}

impl Engine {
    /// Builds an engine over what the adapter loaded. `seed` feeds the internal PRNG (mutation
    /// ids, jitter): pass fresh randomness from `crypto.getRandomValues` in the browser, a fixed
    /// value in tests. The engine starts online, with a pull due.
    pub fn new(config: Config, state: PersistedState, seed: u64) -> Engine {
        let prng = Prng::new(mix_seed(seed, state.meta.client_id, state.meta.next_seq));
        let mut engine = Engine {
            config,
            meta: state.meta.clone(),
            outbox: Outbox::default(),
            dead: Vec::new(),
            rows: BTreeMap::new(),
            respelled: BTreeMap::new(),
            prng,
            push: PushState::default(),
            pull: PullState::new(),
            health: HealthState::default(),
            online: true,
        };
        engine.adopt(state);
        engine
    }

    /// Takes over what another engine over the same store made durable since this one last stepped
    /// (another tab's writes, verdicts or checkpoints): meta, outbox, dead letters and tracked rows
    /// are replaced by `state`, while what is this engine's own and never stored (the push in
    /// flight, the pull run, backoff, health, the PRNG) is kept. An in-flight entry is on the wire,
    /// so no other engine coalesces it away; its verdict still finds it.
    pub fn adopt(&mut self, state: PersistedState) {
        let PersistedState { mut meta, outbox, mut dead, rows } = state;
        // Rows the adapter loaded beyond the tracked keys are not needed in memory.
        let tracked = PersistedState::tracked_keys(&outbox, &dead);
        order::sort_by_key(&mut dead, |d| d.entry.seq);
        self.outbox = outbox.into_iter().map(|e| (e.seq, e)).collect();
        // Defensive: a `next_seq` behind a live entry would reuse a number.
        let highest = self.outbox.keys().chain(dead.iter().map(|d| &d.entry.seq)).max().copied().unwrap_or(0);
        meta.next_seq = meta.next_seq.max(highest + 1);
        self.meta = meta;
        self.dead = dead;
        self.rows = order::map_of(rows.into_iter().map(|r| (r.key(), r)).filter(|(k, _)| tracked.contains(k)));
    }

    /// This engine's tab now runs the sync loops for every tab of its database (the adapter elects
    /// one): it starts with nothing in flight and a pull due, whatever it was doing when it last
    /// led. Entries another leader had sent go again under their ids, which the server applies once.
    pub fn take_over(&mut self) {
        self.push.forget();
        self.pull = PullState::new();
    }

    /// The state of a device that never synced: no entries, no checkpoint, `next_seq` 1.
    pub fn fresh_state(client_id: Uuid) -> PersistedState {
        PersistedState {
            meta: Meta {
                client_id,
                next_seq: 1,
                checkpoint: Checkpoint::default(),
                counters: Counters::default(),
                hlc_last: None,
                slice_limit: None,
            },
            outbox: Vec::new(),
            dead: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// The engine's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The current `meta` record (what the last `PutMeta` persisted).
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The committed checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.meta.checkpoint
    }

    /// The dead-letter store, in `seq` order.
    pub fn dead_letters(&self) -> &[DeadLetter] {
        &self.dead
    }

    /// Every live outbox entry, in issue order.
    pub fn outbox(&self) -> impl Iterator<Item = &OutboxEntry> {
        self.outbox.values()
    }

    /// Every key with a pending write or a dead letter.
    pub fn tracked_keys(&self) -> Vec<RowKey> {
        order::set_of(self.outbox.pending_keys().cloned().chain(self.dead.iter().map(|d| d.entry.key()))).into_iter().collect()
    }

    /// The keys of the push in flight: what its answer or failure may touch.
    pub fn in_flight_keys(&self) -> Vec<RowKey> {
        let Some(in_flight) = &self.push.in_flight else { return Vec::new() };
        order::set_of(in_flight.seqs().filter_map(|s| self.outbox.get(&s)).map(OutboxEntry::key)).into_iter().collect()
    }

    /// The keys of dead letter `seq` and the other members of its atomic group: what requeuing or
    /// discarding it touches.
    pub fn dead_group_keys(&self, seq: i64) -> Vec<RowKey> {
        let batch = self.dead.iter().find(|d| d.entry.seq == seq).and_then(|d| d.entry.batch);
        let keys = self.dead.iter().filter(|d| d.entry.seq == seq || (batch.is_some() && d.entry.batch == batch)).map(|d| d.entry.key());
        order::set_of(keys).into_iter().collect()
    }

    /// True when this engine holds the record of `key` (it touched or was given it since it last
    /// loaded): a step that recomputes the row need not read it.
    pub fn holds_row(&self, key: &RowKey) -> bool {
        self.rows.contains_key(key)
    }

    /// The stored records of `keys` (read in the transaction of the step about to be taken; a key
    /// missing from `found` has no record), for the steps that recompute those rows.
    pub fn remember(&mut self, keys: &[RowKey], found: &BTreeMap<RowKey, RowRecord>) {
        for key in keys {
            match found.get(key) {
                Some(record) if self.is_tracked(key) => {
                    self.rows.insert(key.clone(), record.clone());
                }
                _ => {
                    self.rows.remove(key);
                }
            }
        }
    }

    /// The pending entries for `key`, in seq order: what is replayed over its base.
    pub fn pending_for<'a>(&'a self, key: &'a RowKey) -> impl Iterator<Item = &'a OutboxEntry> + 'a {
        self.outbox.for_key(key)
    }

    /// Tells the engine whether the network is up. While offline, `poll_push` and `poll_pull`
    /// return nothing and `next_wake` is `None`; coming back online makes a pull due at once.
    pub fn set_online(&mut self, online: bool) {
        if online && !self.online {
            self.pull.requested = true;
            self.pull.retry_at = None;
        }
        self.online = online;
    }

    /// The adapter's last `set_online`.
    pub fn is_online(&self) -> bool {
        self.online
    }

    /// Outbox status and durable counters.
    pub fn status(&self) -> Status {
        let c = &self.meta.counters;
        Status {
            pending: self.outbox.len(),
            retrying: self.outbox.values().filter(|e| e.last_error.is_some()).count(),
            delayed_pending: self.outbox.values().filter(|e| e.apply_after.is_some()).count(),
            dead_letters: self.dead.len(),
            applied: c.applied,
            rejected: c.rejected,
            skipped: c.skipped,
            delayed: c.delayed,
            dead_lettered: c.dead_lettered,
        }
    }

    /// Sync health at `now`.
    pub fn health(&self, now: Millis) -> Health {
        Health {
            failure_streak: self.push.streak.max(self.pull.streak).max(self.health.storage_failures),
            last_error: self.health.last_error.clone(),
            last_success_at: self.health.last_success_at,
            in_flight: self.push.in_flight.is_some(),
            pulling: self.pull.run.is_some(),
            online: self.online,
            next_wake_at: self.next_wake(now),
        }
    }

    // ---- shared bookkeeping -------------------------------------------------------------

    /// True when `key` has an outbox entry or a dead letter.
    pub fn is_tracked(&self, key: &RowKey) -> bool {
        self.outbox.has_key(key) || self.dead.iter().any(|d| d.entry.is_for(key))
    }

    /// The mirrored record of `key`, or an empty one.
    pub(crate) fn mirrored(&self, key: &RowKey) -> RowRecord {
        self.rows.get(key).cloned().unwrap_or_else(|| RowRecord::empty(key))
    }

    /// Recomputes `visible` for `key` from `record.base` and the live pending entries, updates
    /// the mirror (dropping it when the key is no longer tracked) and returns the store op.
    pub(crate) fn settle_row(&mut self, mut record: RowRecord) -> StoreOp {
        let key = record.key();
        record.visible = replay(record.base.as_ref(), self.pending_for(&key));
        if self.is_tracked(&key) {
            self.rows.insert(key, record.clone());
        } else {
            self.rows.remove(&key);
        }
        row_op(record)
    }

    /// The op that persists the current meta record.
    pub(crate) fn put_meta(&self) -> StoreOp {
        StoreOp::PutMeta(self.meta.clone())
    }

    /// Hands out the next `client_seq` (persisted through the next `put_meta`).
    pub(crate) fn take_seq(&mut self) -> i64 {
        let seq = self.meta.next_seq;
        self.meta.next_seq += 1;
        seq
    }

    /// Issues the next HLC (persisted through the next `put_meta`).
    pub(crate) fn take_hlc(&mut self, now: Millis) -> String {
        let hlc = crate::hlc::next_hlc(self.meta.hlc_last.as_deref(), now, self.meta.client_id);
        self.meta.hlc_last = Some(hlc.clone());
        hlc
    }

    pub(crate) fn note_success(&mut self, now: Millis) {
        self.health.last_success_at = Some(now);
        self.health.storage_failures = 0;
    }

    pub(crate) fn note_failure(&mut self, error: String) {
        self.health.last_error = Some(error);
    }

    /// The adapter's store refused a step and the adapter rebuilt this engine from what is
    /// durable (which brings a pull due at once and every entry ready). `failures` counts the
    /// consecutive refusals, this one included: nothing is sent before a backoff grown from it,
    /// so a store that keeps refusing (a full disk, a record it cannot hold) is not answered by
    /// requests in a tight loop.
    pub fn after_storage_failure(&mut self, now: Millis, failures: u32, error: String) {
        let wait = crate::backoff::delay(failures.max(1), self.config.retry_base_ms, self.config.retry_max_ms, &mut self.prng);
        self.health.storage_failures = failures;
        self.health.storage_hold_until = Some(now.saturating_add(wait));
        self.health.last_error = Some(error);
    }

    /// Consecutive store refusals so far (carry it into the rebuilt engine).
    pub fn storage_failures(&self) -> u32 {
        self.health.storage_failures
    }

    /// True while a store failure holds requests back.
    pub(crate) fn storage_held(&self, now: Millis) -> bool {
        self.health.storage_hold_until.is_some_and(|until| until > now)
    }
}
