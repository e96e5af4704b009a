//! Crossing between Rust values and plain JS objects, shared by the adapters: as JSON text, which
//! the browser's own `JSON.parse` and `JSON.stringify` turn into objects and back in one call each
//! (a field-by-field crossing costs a call into JS per field, and the code to do it).

use serde::de::DeserializeOwned;
use serde::Serialize;
use wasm_bindgen::prelude::*;

/// `value` as a plain JS object, the shape IndexedDB stores and app code reads.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<JsValue, String> {
    let text = serde_json::to_string(value).map_err(|e| e.to_string())?;
    js_sys::JSON::parse(&text).map_err(|_| "JSON.parse refused the encoded value".to_string())
}

/// A plain JS object (one `encode` made, or any JSON-shaped value) as `T`.
pub fn decode<T: DeserializeOwned>(value: &JsValue) -> Result<T, String> {
    let text = js_sys::JSON::stringify(value).map_err(|_| "JSON.stringify refused the value".to_string())?;
    kizuna_protocol::read_deep(&String::from(text)).map_err(|e| e.to_string())
}
