//! Errors as JS sees them: an `Error` with a stable `code`, a `retryable` flag where it applies,
//! and the original cause when there is one.

use js_sys::Reflect;
use wasm_bindgen::prelude::*;

#[derive(Debug, Clone)]
pub struct ClientError {
    pub code: String,
    pub message: String,
    pub retryable: Option<bool>,
}

impl ClientError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        ClientError { code: code.to_string(), message: message.into(), retryable: None }
    }

    /// A bad argument from the app: nothing was stored.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("INVALID_ARGUMENT", message)
    }

    /// IndexedDB refused or failed; the message carries the browser's words.
    pub fn storage(cause: JsValue) -> Self {
        Self::new("STORAGE_FAILED", describe(&cause))
    }

    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = Some(retryable);
        self
    }
}

impl From<kizuna_engine::EngineError> for ClientError {
    fn from(err: kizuna_engine::EngineError) -> Self {
        ClientError::new(&err.code, err.message)
    }
}

impl From<ClientError> for JsValue {
    fn from(err: ClientError) -> JsValue {
        let js = js_sys::Error::new(&err.message);
        js.set_name("KizunaError");
        let _ = Reflect::set(&js, &"code".into(), &err.code.into());
        if let Some(retryable) = err.retryable {
            let _ = Reflect::set(&js, &"retryable".into(), &retryable.into());
        }
        js.into()
    }
}

/// A readable message for any thrown JS value (DOMException, Error, string).
pub fn describe(value: &JsValue) -> String {
    if let Some(s) = value.as_string() {
        return s;
    }
    let message = Reflect::get(value, &"message".into()).ok().and_then(|m| m.as_string());
    let name = Reflect::get(value, &"name".into()).ok().and_then(|n| n.as_string());
    match (name, message) {
        (Some(n), Some(m)) => format!("{n}: {m}"),
        (None, Some(m)) => m,
        _ => format!("{value:?}"),
    }
}
