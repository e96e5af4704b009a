//! What the engine hands back: store operations to persist atomically, then events to emit.

use kizuna_protocol::{Conflict, PullPage, Reason, Row};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::records::{DeadLetter, Meta, OutboxEntry, RowKey, RowRecord};

/// One write to the adapter's IndexedDB stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StoreOp {
    /// Put a `rows` record (keyed by table and pk).
    PutRow(RowRecord),
    /// Delete a `rows` record.
    DeleteRow(RowKey),
    /// Put an `outbox` entry (keyed by `seq`).
    PutOutbox(OutboxEntry),
    /// Delete the `outbox` entry with this `seq`.
    DeleteOutbox(i64),
    /// Put a `dead` record (keyed by `entry.seq`).
    PutDead(DeadLetter),
    /// Delete the `dead` record with this `entry.seq`.
    DeleteDead(i64),
    /// Replace the `meta` record.
    PutMeta(Meta),
    /// Put one page of the pull run in progress into `staging`.
    PutStaging {
        /// 0-based position of the page within its run.
        page_no: u32,
        /// The page as received.
        page: PullPage,
    },
    /// Put one page of the pull run in progress into `staging` as the JSON text it came in
    /// (`Engine::on_pull_page_text`).
    PutStagingText {
        /// 0-based position of the page within its run.
        page_no: u32,
        /// The page's text, whole.
        text: String,
    },
    /// Empty `staging`.
    ClearStaging,
    /// Empty `rows` (only at the start of a rehydrating commit; the outbox is kept).
    ClearRows,
}

/// Persist `ops` in ONE IndexedDB transaction, in order, then emit `events`. Transactions must
/// be applied in the order the engine returned them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Transaction {
    /// Store operations, applied in order, all or nothing.
    pub ops: Vec<StoreOp>,
    /// Events for the app, emitted after the ops are durable.
    pub events: Vec<Event>,
}

impl Transaction {
    /// True when there is nothing to persist and nothing to say.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.events.is_empty()
    }
}

/// Why visible rows changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeOrigin {
    /// The app wrote them.
    Local,
    /// A committed pull (or an acknowledged write) changed them.
    Remote,
    /// A refusal, a dead letter or a requeue/discard reconciled them with the server's row.
    Compensation,
}

/// Something the app should hear about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// Visible rows changed; re-render what shows them.
    Change {
        /// The keys whose visible row changed (or may have).
        keys: Vec<RowKey>,
        /// Why.
        origin: ChangeOrigin,
        /// Tables in which more rows changed than `keys` lists (a large pull names at most
        /// `LISTED_CHANGES` keys): re-read them whole.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tables: Vec<String>,
    },
    /// The server applied (or acknowledged as `SKIPPED`, then `seq` is `None`) a write.
    Applied {
        /// The mutation id.
        id: Uuid,
        /// The row it wrote, so an app can clear its pending mark without a map of its own.
        key: RowKey,
        /// The server's commit sequence number.
        seq: Option<i64>,
        /// The bucket the server placed the row in (`None`: a SKIPPED verdict names none).
        bucket: Option<String>,
    },
    /// The server refused a write; the local row was reconciled with `server_row`.
    Rejected {
        /// The refused entry.
        mutation: OutboxEntry,
        /// The server's reason.
        reason: Reason,
        /// The server's words for it, when it gave any.
        message: Option<String>,
        /// The row as the caller may see it, or `None`.
        server_row: Option<Row>,
        /// The row as the answer spelled it, when it nests too deep to decode (`server_row` is
        /// then `None`; see `Verdict::server_row_text`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server_row_text: Option<String>,
    },
    /// A write exhausted its budget of permanent failures and moved to the dead-letter store.
    DeadLetter {
        /// The entry as it died.
        entry: OutboxEntry,
        /// The failure that exhausted the budget.
        error: String,
    },
    /// A push request failed as a whole.
    PushFailed {
        /// The error code (wire code or a transport code such as `NETWORK`).
        code: String,
        /// Human-readable detail.
        message: String,
        /// Whether the engine will simply try again (never charged to a budget).
        retryable: bool,
    },
    /// A pull run was abandoned (request failed or a page was refused); nothing committed.
    PullFailed {
        /// The error code.
        code: String,
        /// Human-readable detail.
        message: String,
        /// Whether the failure was classified retryable.
        retryable: bool,
    },
    /// Progress of the pull run in progress, after each page.
    PullProgress {
        /// Pages received in this run.
        pages: u32,
        /// Entries received in this run.
        entries: u64,
        /// Entries the run holds: the server's count with its first page (at least `entries`), or
        /// `entries` on the closing page; `None` when the server gave no count.
        total: Option<u64>,
    },
    /// A new checkpoint was committed.
    Checkpoint {
        /// The committed cursor.
        cursor: String,
        /// Its horizon.
        horizon: i64,
    },
    /// Conflict-journal records attached to the committed run's pages.
    Conflicts(Vec<Conflict>),
    /// The server refused the committed checkpoint as expired; a rehydrate has started.
    CheckpointExpired,
    /// The server's history no longer matches the local snapshot; a rehydrate has started.
    ServerReset,
    /// A rehydrate committed: the local snapshot was replaced (the outbox was kept).
    Rehydrated {
        /// The new checkpoint's horizon.
        horizon: i64,
    },
}
