//! What the adapter feeds in besides wire messages, and what the engine refuses.

use kizuna_protocol::{Op, Row};
use serde::{Deserialize, Serialize};

use crate::records::Millis;

/// One write the app asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalWrite {
    /// The synced table's name.
    pub table: String,
    /// The primary key, as text.
    pub pk: String,
    /// Upsert, patch or delete.
    pub op: Op,
    /// Upsert: the row; patch: the columns it assigns; delete: must be `None`.
    pub columns: Option<Row>,
    /// Hold the write until this time (delay window).
    pub apply_after: Option<Millis>,
    /// Overrides `Config::latest_only_tables` for this write.
    pub latest_only: Option<bool>,
}

/// A whole request failed (transport error, HTTP error, undecodable answer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The HTTP status, when there was a response.
    pub status: Option<u16>,
    /// The error code: the body's `code`, or a transport code (`NETWORK`, `TIMEOUT`, ...).
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

impl Failure {
    /// `CODE: message`, the form kept in `last_error`.
    pub fn describe(&self) -> String {
        format!("{}: {}", self.code, self.message)
    }
}

/// A call the engine refused; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineError {
    /// Machine-readable: `INVALID_ARGUMENT` (the same code the JS face gives any bad argument), `NOT_FOUND`.
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

impl EngineError {
    pub(crate) fn invalid(message: impl Into<String>) -> EngineError {
        EngineError { code: "INVALID_ARGUMENT".into(), message: message.into() }
    }
    pub(crate) fn not_found(message: impl Into<String>) -> EngineError {
        EngineError { code: "NOT_FOUND".into(), message: message.into() }
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for EngineError {}
