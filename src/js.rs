//! Small bridges to the JS side shared by the adapters: encoding values as plain JS objects, and
//! the global's timers (window or worker alike).

use js_sys::{Function, Reflect};
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// `value` as a plain JS object (maps as objects, not `Map`s), the shape IndexedDB stores and
/// app code reads.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<JsValue, serde_wasm_bindgen::Error> {
    value.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
}

fn global_fn(name: &str) -> Option<Function> {
    Reflect::get(&js_sys::global(), &name.into()).ok()?.dyn_into().ok()
}

/// `setTimeout(callback, ms, argument)`; returns the handle for `clear_timeout`.
pub fn set_timeout(callback: &JsValue, ms: i32, argument: &JsValue) -> Option<JsValue> {
    global_fn("setTimeout")?.call3(&js_sys::global(), callback, &ms.into(), argument).ok()
}

pub fn clear_timeout(handle: &JsValue) {
    if let Some(clear) = global_fn("clearTimeout") {
        let _ = clear.call1(&js_sys::global(), handle);
    }
}
