//! The HTTP surface of PROTOCOL.md: push and pull RPCs, the wake stream, metrics, health, the
//! optional dev-token endpoint and static folders, behind one CORS layer.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::{stream, Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{broadcast, watch};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::services::ServeDir;

use crate::config::Config;
use crate::db::{self, Rpc};
use crate::errors::ApiError;
use crate::jwt::{Claims, JwtKey, Role};
use crate::limits::{Admitted, CallerLimits, StreamLimits};
use crate::metrics::{DurableFigures, Metrics};
use crate::wake::Wake;

/// Lifetime of a dev token, in seconds.
const DEV_TOKEN_SECONDS: u64 = 3600;

/// Bodies past the limit are still read (and dropped) up to this many bytes, for at most
/// `DRAIN_TIME`, so that the client, still sending, reads its 413 instead of a connection reset.
const DRAIN_BYTES: usize = 64 * 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// JSON nested deeper than this is refused (KZG02) before PostgreSQL's parser, which would fail
/// the request with a stack-depth error, sees it. The client refuses a write that would make one.
const MAX_JSON_DEPTH: usize = kizuna_protocol::MAX_REQUEST_DEPTH;

#[derive(Clone)]
pub struct AppState {
    pub pool: deadpool_postgres::Pool,
    pub key: JwtKey,
    pub metrics: Arc<Metrics>,
    pub durable: Arc<DurableFigures>,
    pub wake: Wake,
    pub body_limit: usize,
    pub limits: CallerLimits,
    pub stream_limits: StreamLimits,
    /// `--trust-forwarded-for`.
    pub trust_forwarded_for: bool,
    pub statement_timeout: Duration,
    /// How long a request's body may take to arrive (`--body-timeout-ms`); `None`: no limit.
    pub body_timeout: Option<Duration>,
    /// The token `/metrics` on the main address accepts besides a service_role JWT.
    pub metrics_token: Option<String>,
    /// Flips to true on SIGINT/SIGTERM so that open wake streams end and shutdown can complete.
    pub shutdown: watch::Receiver<bool>,
}

pub fn router(state: AppState, config: &Config) -> Router {
    let mut api = Router::new()
        .route("/rest/v1/rpc/kizuna_push", post(push))
        .route("/rest/v1/rpc/kizuna_pull", post(pull))
        .route("/rest/v1/rpc/kizuna_admin", post(admin))
        .route("/kizuna/v1/wake", get(wake))
        .route("/metrics", get(metrics))
        .route("/kizuna/v1/universe-apply", get(universe_apply))
        .route("/healthz", get(healthz));
    if config.dev_tokens {
        api = api.route("/kizuna/v1/dev-token", post(dev_token));
    }
    if let Some(pkg) = &config.pkg {
        api = api.nest_service("/pkg", ServeDir::new(pkg));
    }
    let api = api.method_not_allowed_fallback(|| async {
        let mut error = ApiError::not_found();
        error.status = StatusCode::METHOD_NOT_ALLOWED;
        error.body.message = "method not allowed on this endpoint".into();
        error
    });
    let api = match &config.www {
        Some(www) => api.fallback_service(ServeDir::new(www)),
        None => api.fallback(|| async { ApiError::not_found() }),
    };
    let api = api.with_state(state).layer(cors(&config.cors_origin));
    if config.cross_origin_isolated {
        api.layer(axum::middleware::map_response(isolate))
    } else {
        api
    }
}

/// `--cross-origin-isolated`: the two headers that isolate the page that receives them.
async fn isolate(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin"));
    headers.insert(HeaderName::from_static("cross-origin-embedder-policy"), HeaderValue::from_static("require-corp"));
    response
}

/// What `--metrics-listen` serves: `/metrics` without a token, nothing else.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(|State(app): State<AppState>| async move { metrics_text(&app).await }))
        .with_state(state)
}

fn cors(origins: &str) -> CorsLayer {
    let allow_origin = if origins.trim() == "*" {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .split(',')
                .filter_map(|o| HeaderValue::from_str(o.trim()).ok()),
        )
    };
    CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("apikey"),
            HeaderName::from_static("x-client-info"),
            // Sent by supabase-js / postgrest-js on RPC calls.
            HeaderName::from_static("prefer"),
            HeaderName::from_static("accept-profile"),
            HeaderName::from_static("content-profile"),
        ])
        .max_age(Duration::from_secs(3600))
}

async fn push(State(app): State<AppState>, peer: Peer, headers: HeaderMap, body: Body) -> Response {
    let (claims, result) = rpc(&app, &headers, &peer, body, Rpc::Push).await;
    // A universe-sync token's pushes are the target's apply path: counted there too.
    if claims.is_some_and(|c| c.universe.is_some()) {
        match &result {
            Ok(text) => app.metrics.universe.record_push(text),
            Err(error) => app.metrics.universe.record_error(error.code()),
        }
    }
    answer(&app, result, Metrics::record_push)
}

async fn pull(State(app): State<AppState>, peer: Peer, headers: HeaderMap, body: Body) -> Response {
    let (_, result) = rpc(&app, &headers, &peer, body, Rpc::Pull).await;
    answer(&app, result, Metrics::record_pull)
}

async fn admin(State(app): State<AppState>, peer: Peer, headers: HeaderMap, body: Body) -> Response {
    let (_, result) = rpc(&app, &headers, &peer, body, Rpc::Admin).await;
    answer(&app, result, |_, _| {})
}

/// Token, then the caller's share, then body size, then JSON, then the database: every refusal
/// before the database leaves it untouched. The request's JSON goes to the pack as the caller sent
/// it, and the pack's answer comes back as it wrote it: nothing is re-serialised, so no number is
/// rounded. The pack checks the request's shape, for callers through PostgREST too. Returns the
/// verified claims with the answer (none when the token was refused).
async fn rpc(app: &AppState, headers: &HeaderMap, peer: &Peer, body: Body, rpc: Rpc) -> (Option<Claims>, Result<String, ApiError>) {
    let claims = match authenticate(&app.key, bearer(headers)) {
        Ok(claims) => claims,
        Err(error) => return (None, Err(drained(body, error).await)),
    };
    let result = async {
        let Some(admitted) = app.limits.admit(&claims, caller_address(app, headers, peer)) else {
            return Err(drained(body, ApiError::too_many_requests(app.limits.limit())).await);
        };
        let reading = read_body(headers, body, app.body_limit);
        let bytes = match app.body_timeout {
            Some(limit) => tokio::time::timeout(limit, reading).await.map_err(|_| ApiError::body_timeout(limit))??,
            None => reading.await?,
        };
        let request = request_of(&bytes)?.to_owned();
        // The database's part runs in a task of its own, which holds the caller's share: a caller
        // that goes away mid-request drops this future, not that task. Dropped here, the share was
        // free again at once while the statement ran on in PostgreSQL, on a connection back in the
        // pool (its ROLLBACK queued behind the statement), so a caller that closed its requests
        // could keep every connection busy.
        let (pool, caller, timeout) = (app.pool.clone(), claims.clone(), app.statement_timeout);
        tokio::spawn(async move {
            let _admitted = admitted;
            db::call(&pool, rpc, &caller, &request, timeout).await
        })
        .await
        .unwrap_or_else(|e| Err(ApiError::unavailable(format!("the request's task ended: {e}"))))
    }
    .await;
    (Some(claims), result)
}

fn answer(app: &AppState, result: Result<String, ApiError>, record: impl Fn(&Metrics, &str)) -> Response {
    match result {
        Ok(text) => {
            record(&app.metrics, &text);
            ([(header::CONTENT_TYPE, "application/json")], text).into_response()
        }
        Err(error) => {
            app.metrics.record_error(error.code());
            if error.status.is_server_error() {
                eprintln!(
                    "kizuna-server: {} {}: {}",
                    error.status.as_u16(),
                    error.code(),
                    error.body.message
                );
            }
            error.into_response()
        }
    }
}

/// The connection's peer address, as `into_make_service_with_connect_info` hands it to every request.
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

/// The address a request came from: with `--trust-forwarded-for` the last entry of the last
/// `X-Forwarded-For` line (the address the proxy in front saw; the entries before it are the
/// client's own say), with or without a port; else, or when that entry is no address, the
/// connection's peer.
fn caller_address(app: &AppState, headers: &HeaderMap, peer: &Peer) -> Option<IpAddr> {
    if app.trust_forwarded_for {
        let last = headers.get_all("x-forwarded-for").iter().last().and_then(|line| line.to_str().ok());
        let entry = last.and_then(|line| line.rsplit(',').next()).map(str::trim).unwrap_or_default();
        if let Some(address) = entry.parse::<IpAddr>().ok().or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip())) {
            return Some(address);
        }
    }
    peer.as_ref().map(|Extension(ConnectInfo(address))| address.ip())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn authenticate(key: &JwtKey, token: Option<&str>) -> Result<Claims, ApiError> {
    let token = token
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::unauthorized(crate::jwt::JwtError::Missing))?;
    key.verify(token).map_err(ApiError::unauthorized)
}

/// Reads the body up to `limit` bytes; a declared or actual length over it is 413 KZG01, answered
/// only after the rest of the body was read (see `DRAIN_BYTES`).
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(drained(body, ApiError::body_too_large(limit)).await);
    }
    let mut chunks = body.into_data_stream();
    let mut buffer = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_json(format!("could not read the request body: {e}")))?;
        if buffer.len() + chunk.len() > limit {
            drain(chunks, buffer.len() + chunk.len()).await;
            return Err(ApiError::body_too_large(limit));
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer.into())
}

/// `error`, once the body the client is still sending has been read and dropped.
async fn drained(body: Body, error: ApiError) -> ApiError {
    drain(body.into_data_stream(), 0).await;
    error
}

async fn drain(mut chunks: axum::body::BodyDataStream, mut read: usize) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while read < DRAIN_BYTES {
            match chunks.next().await {
                Some(Ok(chunk)) => read += chunk.len(),
                _ => break,
            }
        }
    })
    .await;
}

/// The PostgREST RPC body: a JSON object whose `request` field is the function's argument, returned
/// as the exact text the caller sent.
fn request_of(bytes: &[u8]) -> Result<&str, ApiError> {
    #[derive(Deserialize)]
    struct Rpc<'a> {
        #[serde(borrow)]
        request: &'a serde_json::value::RawValue,
    }
    let shape = "request body must be a JSON object with a \"request\" field";
    let body: Rpc = serde_json::from_slice(bytes).map_err(|e| {
        if e.is_data() {
            ApiError::bad_json(shape)
        } else {
            ApiError::bad_json(format!("request body is not valid JSON: {e}"))
        }
    })?;
    if kizuna_protocol::nesting_exceeds(body.request.get().as_bytes(), MAX_JSON_DEPTH) {
        return Err(ApiError::bad_json(format!(
            "request is nested deeper than {MAX_JSON_DEPTH} levels"
        )));
    }
    Ok(body.request.get())
}

/// Server-Sent Events, for a token in the `Authorization` header only: a token in a URL ends up in
/// browser, proxy and server logs, so `?access_token=` is refused, not read.
async fn wake(State(app): State<AppState>, peer: Peer, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    match wake_stream(&app, &peer, &headers, &uri) {
        Ok(stream) => stream,
        Err(error) => {
            app.metrics.record_error(error.code());
            error.into_response()
        }
    }
}

/// The wake stream of an admitted caller, or why it was refused.
fn wake_stream(app: &AppState, peer: &Peer, headers: &HeaderMap, uri: &axum::http::Uri) -> Result<Response, ApiError> {
    if uri.query().is_some_and(|q| q.split('&').any(|p| p.starts_with("access_token="))) {
        return Err(ApiError::unauthorized("send the token in the Authorization header, never in the URL"));
    }
    let claims = authenticate(&app.key, bearer(headers))?;
    let admitted = app.stream_limits.admit(&claims, caller_address(app, headers, peer)).map_err(ApiError::too_many_wake_streams)?;
    // The stream ends when its token expires, as every other request with that token is refused
    // then: it went on for as long as the connection lived.
    let left = Duration::from_secs_f64((claims.expires_at - crate::jwt::unix_now() as f64).max(0.0));
    let expiry = Box::pin(tokio::time::sleep(left));
    // Subscribing before answering means every commit after the response headers is seen.
    let receiver = app.wake.subscribe();
    Ok(Sse::new(wake_events(
        receiver,
        app.shutdown.clone(),
        expiry,
        app.metrics.clone(),
        admitted,
    ))
    .keep_alive(
        KeepAlive::new()
            .interval(Duration::from_secs(15))
            .text("keep-alive"),
    )
    .into_response())
}

fn wake_events(
    receiver: broadcast::Receiver<i64>,
    shutdown: watch::Receiver<bool>,
    expiry: std::pin::Pin<Box<tokio::time::Sleep>>,
    metrics: Arc<Metrics>,
    admitted: Admitted,
) -> impl Stream<Item = Result<Event, Infallible>> {
    /// Counts the stream as open, and holds its place among its caller's, for as long as it
    /// lives, however it ends.
    struct Open(Arc<Metrics>, #[allow(dead_code)] Admitted);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.wake_client_gone();
        }
    }
    metrics.wake_client_connected();
    let open = Open(metrics, admitted);
    stream::unfold(
        (receiver, shutdown, expiry, open),
        |(mut receiver, mut shutdown, mut expiry, open)| async move {
            loop {
                if *shutdown.borrow() {
                    return None;
                }
                let horizon = tokio::select! {
                    _ = shutdown.changed() => return None,
                    _ = &mut expiry => return None,
                    received = receiver.recv() => match received {
                        Ok(horizon) => horizon,
                        // Missed some: the newest still waiting says all a client needs.
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                };
                let event = Event::default()
                    .event("wake")
                    .data(json!({ "horizon": horizon }).to_string());
                return Some((Ok(event), (receiver, shutdown, expiry, open)));
            }
        },
    )
}

/// `/metrics` on the main address: for the metrics token or a service_role JWT only.
async fn metrics(State(app): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(refused) = operator_only(&app, &headers) {
        return refused;
    }
    metrics_text(&app).await
}

/// The metrics token or a service_role JWT, as `/metrics` wants them.
fn operator_only(app: &AppState, headers: &HeaderMap) -> Result<(), Response> {
    let token = bearer(headers);
    let by_metrics_token = app
        .metrics_token
        .as_deref()
        .is_some_and(|wanted| token == Some(wanted));
    if by_metrics_token {
        return Ok(());
    }
    match authenticate(&app.key, token) {
        Ok(claims) if claims.role == Role::ServiceRole => Ok(()),
        Ok(_) => Err(ApiError::new(StatusCode::FORBIDDEN, "42501", "metrics need the metrics token or a service_role token")
            .into_response()),
        Err(error) => Err(error.into_response()),
    }
}

/// `GET /kizuna/v1/universe-apply`: the universe-sync apply path's process counters as JSON (what
/// `kizuna-server universe-status --target URL` prints), for the same callers as `/metrics`.
async fn universe_apply(State(app): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(refused) = operator_only(&app, &headers) {
        return refused;
    }
    Json(json!({
        "process_counters": app.metrics.universe.figures(),
        "kind": "process counters of this gateway process, since it started; not a durable audit log",
    }))
    .into_response()
}

/// The exposition itself; also what `--metrics-listen` serves without a token.
pub async fn metrics_text(app: &AppState) -> Response {
    let status = app.durable.read(&app.pool).await;
    let text = app.metrics.render(status.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn healthz(State(app): State<AppState>) -> Response {
    if db::healthy(&app.pool).await {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable").into_response()
    }
}

#[derive(Deserialize)]
struct DevTokenRequest {
    sub: uuid::Uuid,
    #[serde(default)]
    role: Option<String>,
}

/// Demo only (`--dev-tokens`): a one-hour token for any user id (role authenticated or anon), so
/// the demo page needs no auth service.
async fn dev_token(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&headers, body, app.body_limit).await?;
        let request: DevTokenRequest = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_json(format!("expected {{\"sub\": uuid, \"role\"?: text}}: {e}"))
        })?;
        let role = request.role.as_deref().unwrap_or("authenticated");
        // Never service_role: even a demo must not hand out a key that bypasses RLS.
        let role = Role::parse(role)
            .filter(|r| *r != Role::ServiceRole)
            .ok_or_else(|| ApiError::bad_json("role must be authenticated or anon"))?;
        let claims = json!({
            "sub": request.sub.to_string(),
            "role": role.as_str(),
            "aud": "authenticated",
            "iat": crate::jwt::unix_now(),
            "exp": crate::jwt::unix_now() + DEV_TOKEN_SECONDS,
        });
        Ok::<_, ApiError>(
            json!({ "token": app.key.mint(&claims), "expires_in": DEV_TOKEN_SECONDS }),
        )
    }
    .await;
    match result {
        Ok(value) => Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_must_wrap_the_request_and_is_passed_on_as_sent() {
        assert_eq!(request_of(b"{").unwrap_err().code(), "KZG02");
        assert_eq!(request_of(b"[]").unwrap_err().code(), "KZG02");
        assert_eq!(request_of(br#"{"req": 1}"#).unwrap_err().code(), "KZG02");
        assert_eq!(request_of(br#"{"request": 1}"#).unwrap(), "1");
        let exact = br#"{"request": {"n": 123456789012345678901234567890, "f": 0.12345678901234567890123456789, "big": 1e400}}"#;
        assert_eq!(
            request_of(exact).unwrap(),
            r#"{"n": 123456789012345678901234567890, "f": 0.12345678901234567890123456789, "big": 1e400}"#
        );
    }

    #[test]
    fn deep_nesting_is_refused_and_brackets_in_strings_do_not_count() {
        let deep = format!("{{\"request\": {}1{}}}", "[".repeat(65), "]".repeat(65));
        assert_eq!(request_of(deep.as_bytes()).unwrap_err().code(), "KZG02");
        let fine = format!("{{\"request\": {}1{}}}", "[".repeat(64), "]".repeat(64));
        assert!(request_of(fine.as_bytes()).is_ok());
        let quoted = format!("{{\"request\": [\"{}\\\"\"]}}", "[".repeat(100));
        assert!(request_of(quoted.as_bytes()).is_ok(), "{quoted}");
    }
}
