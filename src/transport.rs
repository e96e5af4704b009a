//! The fetch adapter: one POST to a PostgREST-style RPC path, with the caller's token, under a
//! deadline. Every way a request can fail becomes a `Failure` the engine classifies.

use js_sys::{Function, Promise, Reflect};
use kizuna_engine::Failure;
use kizuna_protocol::{codes, ErrorBody, PullRequest, PushRequest, PushResponse};
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{AbortController, Headers, RequestInit, Response};

use crate::error::describe;
use crate::pages::{self, Pulled};

/// How long a session lookup may take before the run fails with `AUTH_SESSION_TIMEOUT`, so a hung
/// refresh fails one sync run instead of hanging it.
const TOKEN_DEADLINE_MS: i32 = 10_000;

pub struct Transport {
    pub base_url: String,
    pub token: Function,
    pub fetch: Option<Function>,
    pub apikey: Option<String>,
    pub request_timeout_ms: i32,
}

fn failure(status: Option<u16>, code: &str, message: impl Into<String>) -> Failure {
    Failure { status, code: code.to_string(), message: message.into() }
}

fn undecodable(status: u16, error: impl std::fmt::Display) -> Failure {
    failure(Some(status), codes::NETWORK, format!("the server's answer does not decode: {error}"))
}

/// Resolves `promise`, or `None` once `ms` have passed. The deadline is a gloo-timers future:
/// whichever way the race ends, the timer is dropped and cleared, so no request leaves one behind.
async fn within(promise: Promise, ms: i32) -> Option<Result<JsValue, JsValue>> {
    use futures_util::future::{select, Either};
    let answer = JsFuture::from(promise);
    let deadline = gloo_timers::future::TimeoutFuture::new(ms.max(0) as u32);
    match select(answer, deadline).await {
        Either::Left((settled, _deadline)) => Some(settled),
        Either::Right(((), _answer)) => None,
    }
}

impl Transport {
    /// The current access token from the app's provider: a string, a promise of one, or null.
    pub async fn access_token(&self) -> Result<String, Failure> {
        let returned = self
            .token
            .call0(&JsValue::NULL)
            .map_err(|e| failure(None, codes::AUTH_SESSION_MISSING, format!("token provider threw: {}", describe(&e))))?;
        // A token handed back at once is used at once: awaiting it yielded, and a pipelined push
        // (`Inner::push_all`) then queued its step's writes before its request left, 3 ms a slice.
        if let Some(token) = returned.as_string().filter(|t| !t.is_empty()) {
            return Ok(token);
        }
        let promise = Promise::resolve(&returned);
        let value = match within(promise, TOKEN_DEADLINE_MS).await {
            None => return Err(failure(None, codes::AUTH_SESSION_TIMEOUT, "the session lookup did not settle within 10 seconds")),
            Some(Err(e)) => return Err(failure(None, codes::AUTH_SESSION_MISSING, format!("token provider failed: {}", describe(&e)))),
            Some(Ok(v)) => v,
        };
        match value.as_string() {
            Some(token) if !token.is_empty() => Ok(token),
            _ => Err(failure(None, codes::AUTH_SESSION_MISSING, "no authentication session: the token provider returned no token")),
        }
    }

    /// Starts a request to `path` with the caller's token in the `Authorization` header (never in
    /// the URL) through the app's `fetch`, abortable by the returned controller.
    fn start(&self, method: &str, path: &str, token: &str, body: Option<&str>) -> Result<(JsValue, AbortController), Failure> {
        let url = format!("{}{path}", self.base_url.trim_end_matches('/'));
        let headers = Headers::new().map_err(|e| failure(None, codes::NETWORK, describe(&e)))?;
        if body.is_some() {
            let _ = headers.set("content-type", "application/json");
        }
        let _ = headers.set("authorization", &format!("Bearer {token}"));
        if let Some(key) = &self.apikey {
            let _ = headers.set("apikey", key);
        }
        let controller = AbortController::new().map_err(|e| failure(None, codes::NETWORK, describe(&e)))?;
        let init = RequestInit::new();
        init.set_method(method);
        init.set_headers(&headers);
        if let Some(body) = body {
            init.set_body(&JsValue::from_str(body));
        }
        init.set_signal(Some(&controller.signal()));
        let fetch = match &self.fetch {
            Some(f) => f.clone(),
            None => Reflect::get(&js_sys::global(), &"fetch".into())
                .map_err(|e| failure(None, codes::NETWORK, describe(&e)))?
                .unchecked_into(),
        };
        let started = fetch
            .call2(&JsValue::NULL, &url.into(), &init)
            .map_err(|e| failure(None, codes::NETWORK, format!("fetch threw: {}", describe(&e))))?;
        Ok((started, controller))
    }

    /// The response of a started request once its headers arrived, within the request deadline
    /// (past it the request is aborted: `TIMEOUT`).
    async fn response(&self, started: &JsValue, controller: &AbortController) -> Result<Response, Failure> {
        let response = match within(Promise::resolve(started), self.request_timeout_ms).await {
            None => {
                controller.abort();
                return Err(failure(None, codes::TIMEOUT, format!("no answer within {} ms", self.request_timeout_ms)));
            }
            Some(Err(e)) => return Err(failure(None, codes::NETWORK, format!("network failure: {}", describe(&e)))),
            Some(Ok(r)) => r,
        };
        response
            .dyn_into()
            .map_err(|_| failure(None, codes::NETWORK, "fetch resolved to something that is not a Response"))
    }

    /// Opens a long-lived GET (the wake stream): the response once its headers arrived, and the
    /// controller that ends it.
    pub async fn open_stream(&self, path: &str) -> Result<(Response, AbortController), Failure> {
        let token = self.access_token().await?;
        let (started, controller) = self.start("GET", path, &token, None)?;
        let response = self.response(&started, &controller).await?;
        if !(200..300).contains(&response.status()) {
            controller.abort();
            return Err(failure(Some(response.status()), &codes::http_status(response.status()), "the stream was refused"));
        }
        Ok((response, controller))
    }

    /// Sends a push and waits for its answer's status and headers only (`push_answer` reads it):
    /// a push may send the next slice between the two (`Inner::push_all`).
    pub async fn push_answering(&self, request: &PushRequest) -> Result<Answering, Failure> {
        self.rpc_answering("kizuna_push", request).await
    }

    /// The rest of a push's answer: its body, read by `pages::read_push_response`.
    pub async fn push_answer(answering: Result<Answering, Failure>) -> Result<PushResponse, Failure> {
        let (status, text) = answering?.text().await?;
        pages::read_push_response(&text).map_err(|e| undecodable(status, e))
    }

    /// A pull page: to stage as its text, or decoded when it closes the run (`pages.rs`).
    pub async fn pull(&self, request: &PullRequest) -> Result<Pulled, Failure> {
        let (status, text) = self.rpc_answering("kizuna_pull", request).await?.text().await?;
        pages::read_page(text).map_err(|e| undecodable(status, e))
    }

    /// POSTs `{"request": body}` to `/rest/v1/rpc/<function>`: the answer once its status and
    /// headers arrived, or the failure.
    async fn rpc_answering<Req: Serialize>(&self, function: &str, body: &Req) -> Result<Answering, Failure> {
        let token = self.access_token().await?;
        // Straight to text: `json!` would build a JSON value first, and serde generates an encoder
        // of the request's types for each way of writing them.
        #[derive(Serialize)]
        struct Envelope<'a, T> {
            request: &'a T,
        }
        let payload = serde_json::to_string(&Envelope { request: body })
            .map_err(|e| failure(None, codes::MALFORMED, format!("cannot encode the request: {e}")))?;
        let (started, controller) = self.start("POST", &format!("/rest/v1/rpc/{function}"), &token, Some(&payload))?;
        // One deadline for the whole exchange: headers and body. A server that sends its headers
        // and then stalls must not hang the sync that waits for it.
        let deadline = js_sys::Date::now() + f64::from(self.request_timeout_ms);
        let response = self.response(&started, &controller).await?;
        Ok(Answering { response, controller, deadline, timeout_ms: self.request_timeout_ms })
    }
}

/// A request whose answer's status and headers have arrived; its body is still to be read.
pub struct Answering {
    response: Response,
    controller: AbortController,
    /// When the whole exchange's deadline passes (`Date.now()`).
    deadline: f64,
    timeout_ms: i32,
}

impl Answering {
    /// True when the status says success: the server committed what the request asked for (an
    /// answer's status follows its transaction's commit).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.response.status())
    }

    /// A successful answer's status and text, or the failure.
    async fn text(self) -> Result<(u16, String), Failure> {
        let status = self.response.status();
        let left = (self.deadline - js_sys::Date::now()).max(0.0) as i32;
        // The body's bytes, copied into wasm memory as they are: `text()` had the browser decode
        // them into a JS string only for it to be encoded back into UTF-8 on its way in (a
        // tenth of a first sync's main-thread time went to the two, in a CPU profile).
        let bytes = match self.response.array_buffer() {
            Ok(p) => match within(p, left).await {
                None => {
                    self.controller.abort();
                    return Err(failure(None, codes::TIMEOUT, format!("no answer within {} ms", self.timeout_ms)));
                }
                Some(Err(e)) => return Err(failure(Some(status), codes::NETWORK, format!("the answer was cut off: {}", describe(&e)))),
                Some(Ok(buffer)) => js_sys::Uint8Array::new(&buffer).to_vec(),
            },
            Err(_) => Vec::new(),
        };
        if (200..300).contains(&status) {
            // Checked as UTF-8 here, then read as text: a decoder of bytes would be a second
            // decoder of JSON values in the package. A body that is not UTF-8 is refused.
            return match String::from_utf8(bytes) {
                Ok(text) => Ok((status, text)),
                Err(_) => Err(failure(Some(status), codes::NETWORK, "the server's answer is not UTF-8")),
            };
        }
        let text = String::from_utf8_lossy(&bytes);
        let body: Option<ErrorBody> = serde_json::from_str(&text).ok();
        Err(match body {
            Some(b) => failure(Some(status), &b.code, b.message),
            None => failure(Some(status), &codes::http_status(status), format!("HTTP {status}: {}", text.chars().take(200).collect::<String>())),
        })
    }
}
