//! Kizuna's wire contract, version 1: the shapes the browser client and the SQL pack exchange.
//!
//! The semantics live in the seeds and the SQL pack; this crate only fixes the shapes so that the
//! client, the gateway and the tests agree. Optional fields are skipped when absent so that what we
//! send is exactly what `PROTOCOL.md` shows.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

mod errors;
mod js_numbers;
mod json_text;
pub use js_numbers::{js_safe_text, same_as_js};
pub use json_text::{nesting_exceeds, read_deep, MAX_READ_DEPTH};
pub use errors::{ErrorBody, ErrorClass, codes};

/// The only protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The deepest a request's JSON may nest (arrays and objects): the gateway refuses a deeper one
/// (`KZG02`) before PostgreSQL's parser, which would fail it with a stack-depth error, sees it.
pub const MAX_REQUEST_DEPTH: usize = 64;

/// The deepest a column's value may nest in a write: a push request holds it four levels down
/// (the request, its `mutations`, a mutation, its `columns`), so a deeper one could never be sent.
pub const MAX_COLUMN_DEPTH: usize = MAX_REQUEST_DEPTH - 4;

/// A row as JSON: column name to value.
pub type Row = Map<String, Value>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushRequest {
    pub protocol: u32,
    pub client_id: Uuid,
    /// In issue order.
    pub mutations: Vec<Mutation>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Writes the whole row; columns it does not name take their defaults on insert.
    Upsert,
    /// Assigns only the columns it names.
    Patch,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mutation {
    /// Idempotency key, unique forever.
    pub id: Uuid,
    /// Strictly increasing per client, never reused.
    pub client_seq: i64,
    pub table: String,
    pub pk: String,
    pub op: Op,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Row>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hlc: Option<String>,
    /// The committed checkpoint's horizon when the write was made (writes follow reads).
    pub read_seq: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Uuid>,
    /// RFC 3339 timestamp; before it the server answers `DELAYED` and stores nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_after: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushResponse {
    /// One per mutation, in the order sent.
    pub verdicts: Vec<Verdict>,
    pub last_mutation_id: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum VerdictStatus {
    Applied,
    Rejected,
    Delayed,
    Skipped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Reason {
    DeleteWins,
    RlsDenied,
    ValidationFailed,
    ConstraintViolation,
    SchemaMismatch,
    BatchAborted,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::DeleteWins => "DELETE_WINS",
            Reason::RlsDenied => "RLS_DENIED",
            Reason::ValidationFailed => "VALIDATION_FAILED",
            Reason::ConstraintViolation => "CONSTRAINT_VIOLATION",
            Reason::SchemaMismatch => "SCHEMA_MISMATCH",
            Reason::BatchAborted => "BATCH_ABORTED",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub id: Uuid,
    pub status: VerdictStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// The bucket the row is in: for `APPLIED`, after the write (absent for a delete, or a row in
    /// no bucket), so a client can place its own new row before a pull does; for `REJECTED`, the
    /// bucket of `server_row`, so a client keeps that row only when it pulls that bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// The key in its one spelling, when the mutation sent another (an upper-case uuid, a number
    /// with leading zeros, or another spelling of a stored key where the column's equality is
    /// coarser than text: `7.00` for the `numeric` row stored as `7.0`): the server wrote (or
    /// rendered `server_row`) under this one, and pulls bring the row under it, so the writer
    /// moves its row there. Absent when they are the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pk: Option<String>,
    /// For `REJECTED`: why, in words an app may show (no internals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For `REJECTED`: the row as the caller's SELECT policy renders it; `None` is JSON `null`.
    #[serde(default)]
    pub server_row: Option<Row>,
    #[serde(default)]
    pub replayed: bool,
    /// `server_row` as the answer spelled it, when it nests deeper than a reader here decodes
    /// (`MAX_READ_DEPTH`, a `jsonb` value written in plain SQL): `server_row` is then `None` and
    /// means unknown, not absent. Never on the wire; the client's reader of push answers sets it.
    #[serde(skip)]
    pub server_row_text: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PullRequest {
    pub protocol: u32,
    pub client_id: Uuid,
    /// Opaque; `None` pulls from the beginning.
    pub cursor: Option<String>,
    pub buckets: Vec<String>,
    pub limit: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Lifecycle {
    /// The run's starting checkpoint is older than the server's retention: rehydrate from `null`.
    CheckpointExpired,
    /// The cursor was issued by another server history (the database was restored or reset):
    /// the local snapshot no longer describes this server, so rehydrate from `null` as well.
    ServerReset,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::CheckpointExpired => "CHECKPOINT_EXPIRED",
            Lifecycle::ServerReset => "SERVER_RESET",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PullPage {
    pub entries: Vec<Entry>,
    pub cursor: String,
    pub done: bool,
    pub horizon: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflicts: Option<Vec<Conflict>>,
    /// On a run's first page: how many entries the run holds, counted as the caller sees them
    /// (null past the server's cap on the count). The horizon advances with the run, so more (or,
    /// after deletes, fewer) may arrive; progress is `entries / max(total, entries)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
}

/// A row or a tombstone. On the wire a tombstone is `{..., "deleted": true}` with no `row`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: i64,
    pub table: String,
    pub pk: String,
    pub bucket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row: Option<Row>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// A conflict-journal record: the value a contested column lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conflict {
    pub table: String,
    pub pk: String,
    pub column: String,
    pub loser: Value,
    pub winner: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loser_seq: Option<i64>,
    pub winner_seq: i64,
    /// The `sub` of the writer whose value lost, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loser_by: Option<String>,
}

#[cfg(test)]
mod tests;
