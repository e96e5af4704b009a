//! The target: an ordinary Kizuna deployment, written through its `POST /rest/v1/rpc/kizuna_push`
//! with a service identity per source universe, and asked for its apply path's process counters.
//!
//! The identity: an HS256 JWT signed with the target's secret (`--target-jwt-secret`), minted per
//! request, with `role: service_role` (RLS is bypassed: a replica takes every selected row, whoever
//! owns it), `sub` = the source universe's id (so the target binds the client id to it, and
//! `auth.uid()` in the target's own triggers reads a uuid) and `kizuna_universe` = the same id
//! (the target gateway counts such pushes as its apply path). Or a ready token (`--target-token`),
//! e.g. a hosted project's service_role key.

use std::time::Duration;

use kizuna_engine::Failure;
use kizuna_protocol::{ErrorBody, PushResponse};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::jwt::{unix_now, JwtKey, UNIVERSE_CLAIM};

/// Lifetime of a minted token: one request's worth, with room for clock skew.
const TOKEN_SECONDS: u64 = 300;

/// The most of a target's answer read: a push answer of 256 refusals each carrying a server row of
/// the pack's largest (64 KiB) is some 17 MiB. A longer answer is a broken or hostile target's,
/// and read whole it could run universe-sync out of memory (only the request timeout bounded it).
const MAX_ANSWER_BYTES: usize = 64 << 20;

pub enum Credentials {
    /// Mint a token per request with the target's JWT secret.
    Secret(JwtKey),
    /// Send this token as it is.
    Token(String),
}

pub struct Target {
    base: String,
    http: reqwest::Client,
    credentials: Credentials,
}

impl Target {
    pub fn new(url: &str, credentials: Credentials, timeout: Duration) -> Result<Target, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("could not build the HTTP client: {e}"))?;
        Ok(Target { base: url.trim_end_matches('/').to_owned(), http, credentials })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    fn token(&self, universe: Uuid) -> String {
        match &self.credentials {
            Credentials::Token(token) => token.clone(),
            Credentials::Secret(key) => key.mint(&json!({
                "sub": universe.to_string(),
                "role": "service_role",
                UNIVERSE_CLAIM: universe.to_string(),
                "iat": unix_now(),
                "exp": unix_now() + TOKEN_SECONDS,
            })),
        }
    }

    /// Pushes `mutations` (the JSON array text the source wrote, sent as is) as the client
    /// `universe`. A refused request, a transport failure or an unreadable answer is a `Failure`
    /// the outbox policy classifies (`ErrorClass::of`).
    pub async fn push(&self, universe: Uuid, mutations: &str) -> Result<PushResponse, Failure> {
        let body = format!(r#"{{"request": {{"protocol": 1, "client_id": "{universe}", "mutations": {mutations}}}}}"#);
        let response = self
            .http
            .post(format!("{}/rest/v1/rpc/kizuna_push", self.base))
            .bearer_auth(self.token(universe))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(transport_failure)?;
        let status = response.status().as_u16();
        let text = answer_text(response).await?;
        if status != 200 {
            let refusal = serde_json::from_str::<ErrorBody>(&text).ok();
            return Err(Failure {
                status: Some(status),
                code: refusal.as_ref().map_or_else(|| kizuna_protocol::codes::http_status(status), |b| b.code.clone()),
                message: refusal.map_or_else(|| text.chars().take(200).collect(), |b| b.message),
            });
        }
        serde_json::from_str::<PushResponse>(&text).map_err(|e| Failure {
            status: Some(status),
            code: "BAD_RESPONSE".into(),
            message: format!("the target's answer is not a PushResponse: {e}"),
        })
    }

    /// The target gateway's apply-path process counters (`GET /kizuna/v1/universe-apply`).
    pub async fn apply_counters(&self) -> Result<Value, String> {
        let response = self
            .http
            .get(format!("{}/kizuna/v1/universe-apply", self.base))
            .bearer_auth(self.token(Uuid::nil()))
            .send()
            .await
            .map_err(|e| format!("target {}: {e}", self.base))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| format!("target {}: {e}", self.base))?;
        if !status.is_success() {
            return Err(format!("target {} answered {status}: {text}", self.base));
        }
        serde_json::from_str(&text).map_err(|e| format!("target {}: not JSON: {e}", self.base))
    }
}

/// The answer's body as text, read up to `MAX_ANSWER_BYTES`: past that a retryable `BAD_RESPONSE`.
async fn answer_text(mut response: reqwest::Response) -> Result<String, Failure> {
    let status = Some(response.status().as_u16());
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_failure)? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(Failure {
                status,
                code: "BAD_RESPONSE".into(),
                message: format!("the target's answer is longer than {MAX_ANSWER_BYTES} bytes"),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn transport_failure(e: reqwest::Error) -> Failure {
    let code = if e.is_timeout() { "TIMEOUT" } else { "NETWORK" };
    // The error's chain says why (connection refused, reset, ...); its first line only names the URL.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        message = format!("{message}: {cause}");
        source = cause.source();
    }
    Failure { status: None, code: code.into(), message }
}
