//! Whole-request errors, answered PostgREST-style, and how a client classifies them.

use serde::{Deserialize, Serialize};

/// The body of a refused request: PostgREST's shape, so Supabase clients read it too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub details: Option<String>,
    #[serde(default)]
    pub hint: Option<String>,
}

/// Error codes, on the wire (`code`) and as SQLSTATEs raised by the SQL pack.
pub mod codes {
    /// Malformed request. Permanent.
    pub const MALFORMED: &str = "KZP01";
    /// More mutations than the table's `max_batch_size`. Permanent; a non-atomic slice is halved.
    pub const BATCH_TOO_LARGE: &str = "KZP02";
    /// Unsupported protocol version. Permanent.
    pub const PROTOCOL_VERSION: &str = "KZP03";
    /// A mutation's row is larger than the pack's `max_row_bytes`. Permanent.
    pub const ROW_TOO_LARGE: &str = "KZP04";
    /// Missing, forged, expired token or unknown role (HTTP 401). Retryable: the session may refresh.
    pub const UNAUTHORIZED: &str = "KZA01";
    /// Request body over the gateway's limit (HTTP 413). Permanent; a non-atomic slice is halved.
    pub const BODY_TOO_LARGE: &str = "KZG01";
    /// Unparseable JSON or a body of the wrong shape, caught by the gateway (HTTP 400). Permanent.
    pub const BAD_JSON: &str = "KZG02";

    // Client-side transport codes: never sent by a server, all retryable.
    pub const NETWORK: &str = "NETWORK";
    pub const TIMEOUT: &str = "TIMEOUT";
    pub const AUTH_SESSION_MISSING: &str = "AUTH_SESSION_MISSING";
    pub const AUTH_SESSION_TIMEOUT: &str = "AUTH_SESSION_TIMEOUT";

    /// The code of a refusal whose body is no Kizuna or PostgREST error (a proxy's page, a `url`
    /// that is not Kizuna): `HTTP` and its status, `HTTP502`. One spelling for every reader: the
    /// browser client's (part of its typed API) and universe sync's (`HTTP_502` until 2026-12-06).
    pub fn http_status(status: u16) -> String {
        format!("HTTP{status}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try again later; never charged to the dead-letter budget.
    Retryable,
    /// The server will refuse the same request again.
    Permanent,
}

impl ErrorClass {
    /// Classifies a failed request by HTTP status and error code. The pack's and the gateway's
    /// refusal codes are permanent, and so is any other 4xx: the server (or PostgREST in front of a
    /// hosted pack) refused this request as it is, for example a value PostgreSQL cannot store
    /// (`22P05`, NUL in a string). 401 (the session may refresh), 404/405 (a wrong `url`), 408,
    /// 425, 429, 5xx, transport failures and anything else stay retryable, because a write the
    /// server never refused must never be given up on.
    pub fn of(status: Option<u16>, code: Option<&str>) -> ErrorClass {
        use codes::*;
        match code {
            Some(MALFORMED | BATCH_TOO_LARGE | PROTOCOL_VERSION | ROW_TOO_LARGE | BODY_TOO_LARGE | BAD_JSON) => {
                return ErrorClass::Permanent;
            }
            Some(UNAUTHORIZED | NETWORK | TIMEOUT | AUTH_SESSION_MISSING | AUTH_SESSION_TIMEOUT) => {
                return ErrorClass::Retryable;
            }
            _ => {}
        }
        match status {
            Some(401 | 404 | 405 | 408 | 425 | 429) => ErrorClass::Retryable,
            Some(400..=499) => ErrorClass::Permanent,
            _ => ErrorClass::Retryable,
        }
    }

    /// True when a permanent refusal says the request was too big, so that a non-atomic slice is
    /// halved rather than cut to its head write.
    pub fn is_size_refusal(code: &str) -> bool {
        // A 413 from what stands in front of the server (a proxy's body limit) too.
        code == codes::BATCH_TOO_LARGE || code == codes::BODY_TOO_LARGE || code == codes::http_status(413)
    }

    pub fn is_retryable(self) -> bool {
        self == ErrorClass::Retryable
    }
}
