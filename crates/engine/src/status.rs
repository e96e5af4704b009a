//! Read-only views for the app: outbox status and sync health.

use serde::{Deserialize, Serialize};

use crate::records::Millis;

/// Outbox status, named after the seed's counters (`universeSyncPending`, `...Retrying`,
/// `...DeadLetter`, `...Applied`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Status {
    /// Entries in the outbox (including held and retrying ones).
    pub pending: usize,
    /// Entries that failed at least once and wait for a retry.
    pub retrying: usize,
    /// Entries holding a delay window (`apply_after` set) that are still pending.
    pub delayed_pending: usize,
    /// Records in the dead-letter store.
    pub dead_letters: usize,
    /// Durable count of `APPLIED` verdicts.
    pub applied: u64,
    /// Durable count of `REJECTED` verdicts.
    pub rejected: u64,
    /// Durable count of `SKIPPED` verdicts.
    pub skipped: u64,
    /// Durable count of `DELAYED` answers.
    pub delayed: u64,
    /// Durable count of entries ever dead-lettered.
    pub dead_lettered: u64,
}

/// Sync health (`getSyncHealth()`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Health {
    /// Consecutive failed requests (push or pull) since the last successful one.
    pub failure_streak: u32,
    /// The last request failure, as `CODE: message`.
    pub last_error: Option<String>,
    /// When a push or pull last succeeded.
    pub last_success_at: Option<Millis>,
    /// A push request is in flight.
    pub in_flight: bool,
    /// A pull run is in progress.
    pub pulling: bool,
    /// The adapter's last `set_online`.
    pub online: bool,
    /// When the engine next wants to be polled, if it waits for anything.
    pub next_wake_at: Option<Millis>,
}
