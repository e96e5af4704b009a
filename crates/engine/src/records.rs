//! The records the adapter persists, one type per IndexedDB store (`rows`, `outbox`, `dead`,
//! `meta`; `staging` holds raw [`PullPage`](kizuna_protocol::PullPage)s).
//!
//! Every type here is plain data: the engine owns the rules, the adapter owns the bytes.

use kizuna_protocol::{Op, Row};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Unix time in milliseconds. The engine never reads a clock: every call brings `now`.
pub type Millis = i64;

/// The identity of a synced row: its table and its primary key (as text, as on the wire).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RowKey {
    /// The synced table's name.
    pub table: String,
    /// The primary key, rendered as text.
    pub pk: String,
}

impl RowKey {
    /// Builds a key from anything string-like.
    pub fn new(table: impl Into<String>, pk: impl Into<String>) -> RowKey {
        RowKey { table: table.into(), pk: pk.into() }
    }
}

/// One row of the `rows` store. The server's row and what the app reads are kept apart so that
/// every checkpoint and every verdict can replay the still-pending writes over a new base.
///
/// Stored, `visible` is left out when it equals `base` (a row with no pending write: nearly every
/// row), so a row is written, cloned and read once, not twice; read back, a missing `visible` is
/// `base` again. Records stored with both read the same.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "StoredRow")]
pub struct RowRecord {
    /// The synced table's name.
    pub table: String,
    /// The primary key, as text.
    pub pk: String,
    /// The bucket the server last delivered the row in (`None` for rows only written locally).
    pub bucket: Option<String>,
    /// The server's row as of the last checkpoint or verdict; `None` when the server has none
    /// (never delivered, deleted, or rejected with a `null` row).
    pub base: Option<Row>,
    /// What the app reads: `base` with the pending writes for this key replayed in seq order;
    /// `None` means the row does not exist for the app.
    pub visible: Option<Row>,
}

/// `RowRecord` as stored: `visible` absent when it equals `base`, `null` when the app has no row.
#[derive(Deserialize)]
struct StoredRow {
    table: String,
    pk: String,
    bucket: Option<String>,
    base: Option<Row>,
    #[serde(default, deserialize_with = "present")]
    visible: Option<Option<Row>>,
}

/// A field that is there, `null` included (serde would read `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<Row>>, D::Error> {
    Option::<Row>::deserialize(d).map(Some)
}

/// `StoredRow` written from a borrowed record: serde's `into` would clone the record, both its
/// rows included, for every row written (a first sync writes every row it brings once).
#[derive(Serialize)]
struct StoredRowRef<'a> {
    table: &'a str,
    pk: &'a str,
    bucket: &'a Option<String>,
    base: &'a Option<Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    visible: Option<&'a Option<Row>>,
}

impl Serialize for RowRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let visible = (self.visible != self.base).then_some(&self.visible);
        StoredRowRef { table: &self.table, pk: &self.pk, bucket: &self.bucket, base: &self.base, visible }.serialize(serializer)
    }
}

impl From<StoredRow> for RowRecord {
    fn from(s: StoredRow) -> RowRecord {
        let visible = s.visible.unwrap_or_else(|| s.base.clone());
        RowRecord { table: s.table, pk: s.pk, bucket: s.bucket, base: s.base, visible }
    }
}

impl RowRecord {
    /// The key of this record.
    pub fn key(&self) -> RowKey {
        RowKey::new(self.table.clone(), self.pk.clone())
    }

    /// A record for a key the store has never seen.
    pub fn empty(key: &RowKey) -> RowRecord {
        RowRecord { table: key.table.clone(), pk: key.pk.clone(), bucket: None, base: None, visible: None }
    }
}

/// One pending local write, the unit of delivery (a row of the `outbox` store, keyed by `seq`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// The mutation's `client_seq`: strictly increasing per client and never reused, even after
    /// every entry was pruned (the next number lives in [`Meta::next_seq`]).
    pub seq: i64,
    /// Idempotency key, unique forever: a resend gets the server's recorded verdict back.
    pub id: Uuid,
    /// The synced table's name.
    pub table: String,
    /// The primary key, as text.
    pub pk: String,
    /// Upsert, patch or delete.
    pub op: Op,
    /// Upsert: the whole row; patch: only the columns it assigns; delete: `None`.
    pub columns: Option<Row>,
    /// Origin hybrid logical clock, `{physical_ms:013}-{counter:04}-{client_id}`, monotonic in
    /// `seq` order.
    pub hlc: String,
    /// The committed checkpoint's horizon when the write was made (writes follow reads).
    pub read_seq: i64,
    /// Members of one atomic group share it; the server applies them all or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Uuid>,
    /// Delay window: not sent before this time, and the server answers `DELAYED` until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_after: Option<Millis>,
    /// Whether a newer write to the same key may replace this one while it is unsent.
    #[serde(default, skip_serializing_if = "is_default")]
    pub latest_only: bool,
    /// When the app made the write.
    pub created_at: Millis,
    /// Set when the entry first goes on the wire. Once true it is never coalesced away: the
    /// server may already have applied it, so only its own verdict may retire it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub sent: bool,
    /// Delivery attempts: requests that carried this entry. A `DELAYED` answer refunds its
    /// attempt, because the server judged the write and found it early, not faulty.
    #[serde(default, skip_serializing_if = "is_default")]
    pub attempts: u32,
    /// The dead-letter budget used: consecutive permanent refusals charged to this entry's
    /// delivery unit (a lone write or one atomic batch). Never charged for a wider slice.
    #[serde(default, skip_serializing_if = "is_default")]
    pub permanent_failures: u32,
    /// Not sent again before this time (backoff after a failure, or a `DELAYED` answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Millis>,
    /// The last failure this entry met, as `CODE: message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Stored and sent between tabs, an entry leaves out the fields that still hold their defaults
/// (a fresh write: no batch, no window, never sent): each is one more property for IndexedDB to
/// clone on every write, and read back, a missing field is its default again.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl OutboxEntry {
    /// The key this entry writes.
    pub fn key(&self) -> RowKey {
        RowKey::new(self.table.clone(), self.pk.clone())
    }

    /// True when the entry writes `key`.
    pub fn is_for(&self, key: &RowKey) -> bool {
        self.table == key.table && self.pk == key.pk
    }
}

/// A write the engine gave up on after its budget of permanent failures (a row of the `dead`
/// store, keyed by `entry.seq`). Kept until the app requeues or discards it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The entry as it was when it died.
    pub entry: OutboxEntry,
    /// The failure that exhausted the budget, as `CODE: message`.
    pub error: String,
    /// When it was moved out of the outbox.
    pub dead_at: Millis,
}

/// The committed pull boundary.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The opaque cursor the last committed run ended with; `None` before the first commit.
    pub cursor: Option<String>,
    /// That run's horizon: the largest server sequence number the local snapshot reflects.
    pub horizon: i64,
    /// When the checkpoint was committed.
    pub committed_at: Option<Millis>,
    /// The bucket set the checkpoint holds (sorted, no repeats): part of the checkpoint, since a
    /// cursor says how far a run got only for the buckets it asked for. `None` in checkpoints
    /// written before this field existed; those are taken to hold the configured set.
    #[serde(default)]
    pub buckets: Option<Vec<String>>,
}

/// Durable verdict counters, named after the seed's status counters.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Counters {
    /// Mutations the server applied.
    pub applied: u64,
    /// Mutations the server refused (a verdict, not a failed request).
    pub rejected: u64,
    /// Mutations acknowledged as `SKIPPED` (seen before; their verdict was pruned).
    pub skipped: u64,
    /// `DELAYED` answers received.
    pub delayed: u64,
    /// Entries moved to the dead-letter store.
    pub dead_lettered: u64,
}

/// The single record of the `meta` store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// This device's id, sent with every request.
    pub client_id: Uuid,
    /// The next `client_seq` to hand out. Stored apart from the live entries so that pruning
    /// every entry and reloading never reuses a number.
    pub next_seq: i64,
    /// The committed pull boundary.
    pub checkpoint: Checkpoint,
    /// Durable verdict counters.
    pub counters: Counters,
    /// The last HLC issued, so the clock stays monotonic across reloads and clock steps.
    pub hlc_last: Option<String>,
    /// The narrowed slice width while a permanent failure is being isolated (see
    /// `delivery.rs`); `None` means `Config::max_slice`. Persisted so that a reload in the
    /// middle of the search continues it instead of starting over from the full width.
    #[serde(default)]
    pub slice_limit: Option<u32>,
}

/// Everything the engine needs at start, read by the adapter from IndexedDB.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedState {
    /// The `meta` record.
    pub meta: Meta,
    /// Every `outbox` entry (any order; the engine sorts by `seq`).
    pub outbox: Vec<OutboxEntry>,
    /// Every `dead` record.
    pub dead: Vec<DeadLetter>,
    /// The `rows` records of every key that has an outbox or dead-letter entry (see
    /// [`PersistedState::tracked_keys`]). The engine mirrors these rows because verdicts, dead
    /// letters and discards must recompute `visible` from `base` without a store read.
    #[serde(default)]
    pub rows: Vec<RowRecord>,
}

impl PersistedState {
    /// The keys whose `rows` records belong in [`PersistedState::rows`]: every key with an
    /// outbox entry or a dead letter. The adapter reads `outbox` and `dead` first, then these.
    pub fn tracked_keys(outbox: &[OutboxEntry], dead: &[DeadLetter]) -> std::collections::BTreeSet<RowKey> {
        crate::order::set_of(outbox.iter().map(OutboxEntry::key).chain(dead.iter().map(|d| d.entry.key())))
    }
}

#[cfg(test)]
mod stored_records {
    use super::{OutboxEntry, RowRecord};
    use serde_json::json;

    fn record(base: serde_json::Value, visible: serde_json::Value) -> RowRecord {
        RowRecord {
            table: "t".into(),
            pk: "1".into(),
            bucket: Some("b".into()),
            base: base.as_object().cloned(),
            visible: visible.as_object().cloned(),
        }
    }

    #[test]
    fn a_row_with_no_pending_write_is_stored_once_and_reads_back_whole() {
        let same = record(json!({"a": 1}), json!({"a": 1}));
        let stored = serde_json::to_value(&same).unwrap();
        assert_eq!(stored, json!({"table": "t", "pk": "1", "bucket": "b", "base": {"a": 1}}));
        assert_eq!(serde_json::from_value::<RowRecord>(stored).unwrap(), same);
    }

    #[test]
    fn a_row_its_pending_writes_change_or_hide_keeps_what_the_app_sees() {
        for r in [record(json!({"a": 1}), json!({"a": 2})), record(json!({"a": 1}), json!(null)), record(json!(null), json!({"a": 2}))] {
            let stored = serde_json::to_value(&r).unwrap();
            assert!(stored.get("visible").is_some(), "{stored}");
            assert_eq!(serde_json::from_value::<RowRecord>(stored).unwrap(), r);
        }
    }

    #[test]
    fn a_fresh_outbox_entry_is_stored_without_its_defaults_and_an_earlier_versions_reads_the_same() {
        let fresh = json!({"seq": 7, "id": "00000000-0000-4000-8000-000000000007", "table": "t", "pk": "1", "op": "upsert",
                           "columns": {"a": 1}, "hlc": "0001-0000-x", "read_seq": 3, "created_at": 5});
        let entry: OutboxEntry = serde_json::from_value(fresh.clone()).unwrap();
        assert_eq!(serde_json::to_value(&entry).unwrap(), fresh, "no default is stored");
        let mut earlier = fresh.clone();
        for (field, default) in [("batch", json!(null)), ("apply_after", json!(null)), ("latest_only", json!(false)), ("sent", json!(false)),
                                 ("attempts", json!(0)), ("permanent_failures", json!(0)), ("retry_at", json!(null)), ("last_error", json!(null))] {
            earlier[field] = default;
        }
        assert_eq!(serde_json::from_value::<OutboxEntry>(earlier).unwrap(), entry);
        let sent = OutboxEntry { sent: true, attempts: 2, retry_at: Some(9), last_error: Some("E: m".into()), ..entry };
        assert_eq!(serde_json::from_value::<OutboxEntry>(serde_json::to_value(&sent).unwrap()).unwrap(), sent);
    }

    #[test]
    fn a_record_stored_by_an_earlier_version_with_both_reads_the_same() {
        let old = json!({"table": "t", "pk": "1", "bucket": "b", "base": {"a": 1}, "visible": {"a": 1}});
        assert_eq!(serde_json::from_value::<RowRecord>(old).unwrap(), record(json!({"a": 1}), json!({"a": 1})));
    }
}
