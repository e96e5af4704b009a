//! What the app hands in: strings, rows and option objects, checked and turned into JSON. Every
//! refusal is an `INVALID_ARGUMENT` that names the argument, and nothing is stored.
//!
//! Rows follow `JSON.stringify`, the rule every other JS client of the server applies: a property
//! whose value is `undefined` is left out (it does not set the column to null), and a `Date`
//! becomes its ISO string. What JSON cannot carry faithfully is refused rather than changed
//! quietly: `NaN` and the infinities, functions, symbols, `BigInt`s, and objects that are not
//! plain (a `Map`, a class instance).

use js_sys::{Array, Object, Reflect};
use kizuna_protocol::Row;
use serde_json::{Number, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::api::invalid;

/// A required string argument, non-empty.
pub fn text(value: &JsValue, what: &str) -> Result<String, JsValue> {
    match string(value, what)? {
        Some(s) if !s.is_empty() => Ok(s),
        Some(_) => Err(invalid(format!("{what} must not be empty"))),
        None => Err(invalid(format!("{what} must be a string"))),
    }
}

/// A JS string as it is, or `None` for another type. Refused rather than changed: a lone
/// surrogate (which has no UTF-8 form, so converting it would replace it with U+FFFD) and NUL
/// (which no PostgreSQL text or JSON value can hold, so the server could never take the write).
fn string(value: &JsValue, what: &str) -> Result<Option<String>, JsValue> {
    let Some(js) = value.dyn_ref::<js_sys::JsString>() else {
        return Ok(None);
    };
    if !js.is_valid_utf16() {
        return Err(invalid(format!("{what} holds a lone surrogate (a broken UTF-16 string), which JSON cannot carry")));
    }
    let s = String::from(js);
    if s.contains('\0') {
        return Err(invalid(format!("{what} holds a NUL character (\\u0000), which PostgreSQL cannot store")));
    }
    Ok(Some(s))
}

/// A row or a set of columns: a plain object of JSON values.
pub fn row(value: &JsValue, what: &str) -> Result<Row, JsValue> {
    if !is_plain_object(value) {
        return Err(invalid(format!("{what} must be a plain object of columns")));
    }
    match json(value, what)? {
        Value::Object(map) => Ok(map),
        _ => Err(invalid(format!("{what} must be a plain object of columns"))),
    }
}

/// An optional options argument: `undefined`/`null`, or a plain object.
pub fn options(value: &JsValue, what: &str) -> Result<Option<Object>, JsValue> {
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    if !is_plain_object(value) {
        return Err(invalid(format!("{what} must be an object")));
    }
    Ok(Some(value.clone().unchecked_into()))
}

/// A whole number (a dead letter's `seq`).
pub fn whole_number(value: f64, what: &str) -> Result<i64, JsValue> {
    if value.is_finite() && value.fract() == 0.0 && value.abs() <= 9_007_199_254_740_991.0 {
        Ok(value as i64)
    } else {
        Err(invalid(format!("{what} must be a whole number, not {}", js_number(value))))
    }
}

/// A number as JS writes it (`Infinity`, `NaN`, `1e+21`): the app's own words for its value, where
/// Rust writes `inf` and `1000000000000000000000`.
fn js_number(n: f64) -> String {
    js_sys::Number::from(n).to_string_with_radix(10).map(String::from).unwrap_or_default()
}

/// A point in time: a valid `Date`, or milliseconds since the epoch.
pub fn instant(value: &JsValue, what: &str) -> Result<i64, JsValue> {
    let ms = match value.dyn_ref::<js_sys::Date>() {
        Some(date) => date.get_time(),
        None => value.as_f64().ok_or_else(|| invalid(format!("{what} must be a Date or a number of ms since the epoch")))?,
    };
    if ms.is_finite() {
        Ok(ms as i64)
    } else {
        Err(invalid(format!("{what} is not a valid time")))
    }
}

fn is_plain_object(value: &JsValue) -> bool {
    if !value.is_object() || Array::is_array(value) || value.is_function() {
        return false;
    }
    let proto = Object::get_prototype_of(value);
    proto.is_null() || proto == Object::get_prototype_of(&Object::new())
}

fn json(value: &JsValue, what: &str) -> Result<Value, JsValue> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    if let Some(b) = value.as_bool() {
        return Ok(Value::Bool(b));
    }
    if let Some(s) = string(value, what)? {
        return Ok(Value::String(s));
    }
    if let Some(n) = value.as_f64() {
        return number(n).ok_or_else(|| invalid(format!("{what} is {}, which JSON cannot hold", js_number(n))));
    }
    if let Some(date) = value.dyn_ref::<js_sys::Date>() {
        if !date.get_time().is_finite() {
            return Err(invalid(format!("{what} is an invalid Date")));
        }
        return Ok(Value::String(date.to_iso_string().into()));
    }
    if Array::is_array(value) {
        let items: Array = value.clone().unchecked_into();
        // Inside an array JSON has no way to leave a slot out: undefined becomes null, as there.
        return items
            .iter()
            .enumerate()
            .map(|(i, item)| if item.is_undefined() { Ok(Value::Null) } else { json(&item, &format!("{what}[{i}]")) })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    if is_plain_object(value) {
        let mut map = serde_json::Map::new();
        for key in Object::keys(value.unchecked_ref::<Object>()).iter() {
            let name = string(&key, &format!("a column name in {what}"))?.unwrap_or_default();
            let item = Reflect::get(value, &key).unwrap_or(JsValue::UNDEFINED);
            if !item.is_undefined() {
                map.insert(name.clone(), json(&item, &format!("{what}.{name}"))?);
            }
        }
        return Ok(Value::Object(map));
    }
    let kind = if value.is_undefined() {
        "undefined".to_string()
    } else if value.is_function() {
        "a function".to_string()
    } else if value.is_object() {
        let constructor = Reflect::get(value, &"constructor".into()).ok();
        let name = constructor.and_then(|c| Reflect::get(&c, &"name".into()).ok()).and_then(|n| n.as_string());
        format!("a {}", name.unwrap_or_else(|| "non-plain object".into()))
    } else {
        format!("a {}", value.js_typeof().as_string().unwrap_or_default())
    };
    Err(invalid(format!("{what} is {kind}, which is not a JSON value (use plain objects, arrays, strings, numbers, booleans and null)")))
}

/// A finite number, as an integer when it is one, so `1` stays `1` on the wire.
fn number(n: f64) -> Option<Value> {
    if !n.is_finite() {
        return None;
    }
    if n.fract() == 0.0 && n.abs() <= 9_007_199_254_740_991.0 {
        return Some(Value::Number((n as i64).into()));
    }
    Number::from_f64(n).map(Value::Number)
}
