//! Refused requests, answered like PostgREST: an HTTP status and `{code, message, details, hint}`,
//! with `details` and `hint` null when there are none, so the same client code reads both.
//!
//! | cause                                         | status | code            |
//! |-----------------------------------------------|--------|-----------------|
//! | missing/forged/expired token, unknown role    | 401    | KZA01           |
//! | body over `--body-limit`                      | 413    | KZG01           |
//! | body not JSON / not `{"request": ...}`        | 400    | KZG02           |
//! | `request` of the wrong shape (gateway check)  | 400    | KZP01           |
//! | the caller has `--caller-concurrency` requests open | 429 | KZG05        |
//! | a wake stream past `--wake-streams-per-caller` or `--max-wake-streams` | 429 | KZG05 |
//! | the body did not arrive within `--body-timeout-ms` | 408 | KZG06         |
//! | SQLSTATE KZP01..KZP04 raised by the pack      | 400    | the SQLSTATE    |
//! | SQLSTATE KZA01 raised by the pack             | 401    | KZA01           |
//! | database unreachable, pool exhausted          | 503    | KZG03           |
//! | no such endpoint / method not allowed         | 404/405| KZG04           |
//! | any other SQLSTATE                            | PostgREST's status for it (below) | the SQLSTATE |
//!
//! PostgREST's statuses: 08 503; 09 500; 0L, 0P, 28 403; 23503, 23505 409; 25006 405; 25, 2D, 38,
//! 39, 3B, 40 500; 53400 500; 53 503; 54, 55, 57, 58, F0, HV, XX 500; P0001 400; P0 500; 42883,
//! 42P01 404; 42P17 500; 42501 401 for `anon`, 403 otherwise; anything else 400. Serialization
//! failures and deadlocks (40001, 40P01) are retried by the gateway before they are answered.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kizuna_protocol::{codes, ErrorBody};

use crate::limits::StreamRefusal;

/// Gateway codes not (yet) in the protocol crate. KZG03 comes with 503, which clients retry;
/// KZG04 means a wrong URL or method, a configuration mistake rather than a refused request.
pub mod gateway_codes {
    /// The database could not be reached or the pool had no connection to give (HTTP 503).
    pub const DATABASE_UNAVAILABLE: &str = "KZG03";
    /// No such endpoint (HTTP 404), or a method the endpoint does not take (HTTP 405).
    pub const NOT_FOUND: &str = "KZG04";
    /// The caller already has its share of requests in flight (HTTP 429); retry after a moment.
    pub const TOO_MANY_REQUESTS: &str = "KZG05";
    /// The request's body did not arrive within `--body-timeout-ms` (HTTP 408); retry.
    pub const BODY_TIMEOUT: &str = "KZG06";
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: ErrorBody {
                code: code.to_owned(),
                message: message.into(),
                details: None,
                hint: None,
            },
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> ApiError {
        self.body.hint = Some(hint.into());
        self
    }

    pub fn unauthorized(why: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHORIZED,
            why.to_string(),
        )
    }

    pub fn bad_json(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, codes::BAD_JSON, message)
    }

    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, codes::MALFORMED, message)
    }

    pub fn body_too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::BODY_TOO_LARGE,
            format!("request body is larger than {limit} bytes"),
        )
        .with_hint("send fewer mutations per request")
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            gateway_codes::DATABASE_UNAVAILABLE,
            message,
        )
    }

    pub fn not_found() -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            gateway_codes::NOT_FOUND,
            "no such endpoint",
        )
    }

    pub fn too_many_requests(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            gateway_codes::TOO_MANY_REQUESTS,
            format!("this caller already has {limit} requests in flight"),
        )
        .with_hint("wait for an answer before sending the next request")
    }

    /// A wake stream past `--wake-streams-per-caller` or `--max-wake-streams`.
    pub fn too_many_wake_streams(refusal: StreamRefusal) -> ApiError {
        let (whose, limit) = match refusal {
            StreamRefusal::Caller(limit) => ("this caller already has", limit),
            StreamRefusal::Total(limit) => ("this server already holds", limit),
        };
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            gateway_codes::TOO_MANY_REQUESTS,
            format!("{whose} {limit} wake streams open"),
        )
        .with_hint("pull on a timer meanwhile, and open a wake stream again once another has ended")
    }

    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            gateway_codes::BODY_TIMEOUT,
            format!("the request body did not arrive within {} ms", limit.as_millis()),
        )
        .with_hint("send the request again")
    }

    /// Maps a database error as PostgREST does. Only the error's own message, detail and hint reach
    /// the caller: never the statement, its position or the internal query.
    pub fn from_db(error: &tokio_postgres::Error, anon: bool) -> ApiError {
        let Some(db) = error.as_db_error() else {
            // No SQLSTATE: the connection broke or could not be made.
            return ApiError::unavailable("database connection failed");
        };
        let code = db.code().code();
        let present = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
        ApiError {
            status: status_for_sqlstate(code, anon),
            body: ErrorBody {
                code: code.to_owned(),
                message: db.message().to_owned(),
                details: present(db.detail()),
                hint: present(db.hint()),
            },
        }
    }

    /// A database refusal told in the pack's words, with the status PostgREST gives its SQLSTATE.
    pub fn refused(code: &str, message: String, anon: bool) -> ApiError {
        ApiError::new(status_for_sqlstate(code, anon), code, message)
    }

    pub fn code(&self) -> &str {
        &self.body.code
    }
}

pub fn is_retryable_sqlstate(code: &str) -> bool {
    matches!(code, "40001" | "40P01")
}

fn status_for_sqlstate(code: &str, anon: bool) -> StatusCode {
    let class = code.get(..2).unwrap_or("");
    let status = match code {
        "KZP01" | "KZP02" | "KZP03" | "KZP04" => 400,
        "KZA01" => 401,
        "42501" if anon => 401,
        "42501" => 403,
        "23503" | "23505" => 409,
        "25006" => 405,
        "53400" => 500,
        "P0001" => 400,
        "42883" | "42P01" => 404,
        "42P17" => 500,
        _ => match class {
            "08" | "53" => 503,
            "0L" | "0P" | "28" => 403,
            "09" | "25" | "2D" | "38" | "39" | "3B" | "40" | "54" | "55" | "57" | "58" | "F0" | "HV"
            | "XX" | "P0" => 500,
            _ => 400,
        },
    };
    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_postgrest_statuses() {
        for (code, anon, status) in [
            ("KZP01", false, 400),
            ("KZP02", false, 400),
            ("KZP03", false, 400),
            ("KZP04", false, 400),
            ("KZA01", false, 401),
            ("42501", true, 401),
            ("42501", false, 403),
            ("40001", false, 500),
            ("40P01", false, 500),
            ("08006", false, 503),
            ("53300", false, 503),
            ("53400", false, 500),
            ("57P01", false, 500),
            ("57014", false, 500),
            ("23505", false, 409),
            ("23503", false, 409),
            ("23514", false, 400),
            ("22P05", false, 400),
            ("54000", false, 500),
            ("42883", false, 404),
            ("P0001", false, 400),
            ("P0004", false, 500),
            ("XX000", false, 500),
            ("28000", false, 403),
            ("25006", false, 405),
        ] {
            assert_eq!(status_for_sqlstate(code, anon).as_u16(), status, "{code}");
        }
    }
}
