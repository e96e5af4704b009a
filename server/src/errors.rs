//! Refused requests, answered like PostgREST: an HTTP status and `{code, message, details, hint}`.
//!
//! | cause                                         | status | code            |
//! |-----------------------------------------------|--------|-----------------|
//! | missing/forged/expired token, unknown role    | 401    | KZA01           |
//! | body over `--body-limit`                      | 413    | KZG01           |
//! | body not JSON / not `{"request": ...}`        | 400    | KZG02           |
//! | `request` of the wrong shape (gateway check)  | 400    | KZP01           |
//! | SQLSTATE KZP01..KZP04 raised by the pack      | 400    | the SQLSTATE    |
//! | SQLSTATE KZA01 raised by the pack             | 401    | KZA01           |
//! | SQLSTATE 42501 (insufficient privilege)       | 403    | 42501           |
//! | 40001/40P01 still failing after the retries   | 503    | the SQLSTATE    |
//! | database unreachable, pool exhausted, class 08/53/57P | 503 | KZG03 or the SQLSTATE |
//! | no such endpoint / method not allowed         | 404/405| KZG04           |
//! | any other SQLSTATE                            | 500    | the SQLSTATE    |

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kizuna_protocol::{codes, ErrorBody};

/// Gateway codes not (yet) in the protocol crate. KZG03 comes with 503, which clients retry;
/// KZG04 means a wrong URL or method, a configuration mistake rather than a refused request.
pub mod gateway_codes {
    /// The database could not be reached or the pool had no connection to give (HTTP 503).
    pub const DATABASE_UNAVAILABLE: &str = "KZG03";
    /// No such endpoint (HTTP 404), or a method the endpoint does not take (HTTP 405).
    pub const NOT_FOUND: &str = "KZG04";
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

    /// Maps a database error. Only the error's own message, detail and hint reach the caller: never
    /// the statement, its position or the internal query.
    pub fn from_db(error: &tokio_postgres::Error) -> ApiError {
        let Some(db) = error.as_db_error() else {
            // No SQLSTATE: the connection broke or could not be made.
            return ApiError::unavailable("database connection failed");
        };
        let code = db.code().code();
        ApiError {
            status: status_for_sqlstate(code),
            body: ErrorBody {
                code: code.to_owned(),
                message: db.message().to_owned(),
                details: db.detail().map(str::to_owned),
                hint: db.hint().map(str::to_owned),
            },
        }
    }

    pub fn code(&self) -> &str {
        &self.body.code
    }
}

pub fn is_retryable_sqlstate(code: &str) -> bool {
    matches!(code, "40001" | "40P01")
}

fn status_for_sqlstate(code: &str) -> StatusCode {
    match code {
        "KZP01" | "KZP02" | "KZP03" | "KZP04" => StatusCode::BAD_REQUEST,
        "KZA01" => StatusCode::UNAUTHORIZED,
        "42501" => StatusCode::FORBIDDEN,
        // Serialization failures only get here once the retries are spent; shutdown, connection and
        // resource exhaustion are the database being unavailable, not a fault in the request.
        c if is_retryable_sqlstate(c) => StatusCode::SERVICE_UNAVAILABLE,
        c if c.starts_with("08") || c.starts_with("53") || c.starts_with("57P") => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
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
    fn sqlstates_map_to_statuses() {
        for (code, status) in [
            ("KZP01", 400),
            ("KZP02", 400),
            ("KZP03", 400),
            ("KZP04", 400),
            ("KZA01", 401),
            ("42501", 403),
            ("40001", 503),
            ("40P01", 503),
            ("08006", 503),
            ("53300", 503),
            ("57P01", 503),
            ("23505", 500),
            ("42883", 500),
            ("P0001", 500),
        ] {
            assert_eq!(status_for_sqlstate(code).as_u16(), status, "{code}");
        }
    }
}
