//! Encoding values as plain JS objects, shared by the adapters.

use serde::Serialize;
use wasm_bindgen::prelude::*;

/// `value` as a plain JS object (maps as objects, not `Map`s), the shape IndexedDB stores and
/// app code reads.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<JsValue, serde_wasm_bindgen::Error> {
    value.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
}
