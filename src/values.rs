//! What the app hands in: strings, rows and option objects, checked and turned into JSON. Every
//! refusal is an `INVALID_ARGUMENT` that names the argument, and nothing is stored.
//!
//! Rows follow `JSON.stringify`, the rule every other JS client of the server applies: a property
//! whose value is `undefined` is left out (it does not set the column to null), and a `Date`
//! becomes its ISO string. What JSON cannot carry faithfully is refused rather than changed
//! quietly: `NaN` and the infinities, functions, symbols, `BigInt`s, and objects that are not
//! plain (a `Map`, a class instance).

use std::fmt::Display;

use js_sys::{Array, Object, Reflect};
use kizuna_protocol::{Row, MAX_COLUMN_DEPTH};
use serde_json::{Number, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::api::invalid;

/// A required string argument, non-empty. `what` names it in the refusal (and is only spelled out
/// for one: a batch names each field of each write it checks).
pub fn text(value: &JsValue, what: impl Display) -> Result<String, JsValue> {
    match string(value, &what)? {
        Some(s) if !s.is_empty() => Ok(s),
        Some(_) => Err(invalid(format!("{what} must not be empty"))),
        None => Err(invalid(format!("{what} must be a string"))),
    }
}

/// A JS string as it is, or `None` for another type. Refused rather than changed: a lone
/// surrogate (which has no UTF-8 form, so converting it would replace it with U+FFFD) and NUL
/// (which no PostgreSQL text or JSON value can hold, so the server could never take the write).
fn string(value: &JsValue, what: &dyn Display) -> Result<Option<String>, JsValue> {
    let Some(s) = value.as_string() else {
        return Ok(None);
    };
    // The conversion put U+FFFD where a lone surrogate was: only a string that now holds one (an
    // app's own U+FFFD, or a broken string) is asked again, in JS, whether it was whole.
    if s.contains('\u{FFFD}') && !value.unchecked_ref::<js_sys::JsString>().is_valid_utf16() {
        return Err(invalid(format!("{what} holds a lone surrogate (a broken UTF-16 string), which JSON cannot carry")));
    }
    if s.contains('\0') {
        return Err(invalid(format!("{what} holds a NUL character (\\u0000), which PostgreSQL cannot store")));
    }
    Ok(Some(s))
}

/// A row or a set of columns: a plain object of JSON values.
pub fn row(value: &JsValue, what: impl Display) -> Result<Row, JsValue> {
    if !is_plain_object(value, &what)? {
        return Err(invalid(format!("{what} must be a plain object of columns")));
    }
    columns(value, &what, 0)
}

/// An optional options argument: `undefined`/`null`, or a plain object.
pub fn options(value: &JsValue, what: &str) -> Result<Option<Object>, JsValue> {
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    if !is_plain_object(value, &what)? {
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

thread_local! {
    /// This realm's `Object.prototype`, asked for once.
    static OBJECT_PROTOTYPE: Object = Object::get_prototype_of(&Object::new());
}

/// An object whose prototype is `Object.prototype` or null (an array's, a function's, a `Map`'s or
/// a class instance's is not), and not an array whatever its prototype (`JSON.stringify` writes
/// one as an array). A `Proxy` whose traps throw (or a revoked one) is refused with what it threw.
fn is_plain_object(value: &JsValue, what: &dyn Display) -> Result<bool, JsValue> {
    if !value.is_object() || is_array(value).map_err(|e| unreadable(what, &e))? {
        return Ok(false);
    }
    let proto = Reflect::get_prototype_of(value).map_err(|e| unreadable(what, &e))?;
    Ok(proto.is_null() || OBJECT_PROTOTYPE.with(|plain| proto == *plain))
}

/// `what.name`, spelled out only when a refusal names it.
struct Field<'a> {
    parent: &'a dyn Display,
    name: &'a str,
}

impl Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.parent, self.name)
    }
}

// What the app hands in is read through calls that give back what they throw: a getter, a `Proxy`
// trap or a revoked `Proxy` throws inside any of them, and an exception passing through wasm
// leaves its call without a code (a promise being built then never settled).
#[wasm_bindgen]
extern "C" {
    /// `Object.keys`, with what it throws (a `Proxy` whose `ownKeys` throws) as an `Err`.
    #[wasm_bindgen(js_namespace = Object, js_name = keys, catch)]
    fn own_keys(object: &JsValue) -> Result<Array, JsValue>;
    #[wasm_bindgen(js_namespace = Array, js_name = isArray, catch)]
    fn is_array(value: &JsValue) -> Result<bool, JsValue>;
    /// `Date.prototype.getTime` of `date` itself, not a method the object put in its place.
    #[wasm_bindgen(js_namespace = ["Date", "prototype", "getTime"], js_name = call, catch)]
    fn date_time(date: &JsValue) -> Result<f64, JsValue>;
    #[wasm_bindgen(js_namespace = ["Date", "prototype", "toISOString"], js_name = call, catch)]
    fn date_iso_text(date: &JsValue) -> Result<String, JsValue>;
}

/// The names of an object's own enumerable properties (`Object.keys`).
pub fn property_names(object: &JsValue, what: &dyn Display) -> Result<Vec<String>, JsValue> {
    Ok(own_keys(object).map_err(|e| unreadable(what, &e))?.iter().filter_map(|k| k.as_string()).collect())
}

/// The first own enumerable property of `object` that is not among `known`: options, filters and
/// batch members refuse what they do not take instead of dropping it.
pub fn unknown_key(object: &JsValue, what: &dyn Display, known: &[&str]) -> Result<Option<String>, JsValue> {
    Ok(property_names(object, what)?.into_iter().find(|k| !known.contains(&k.as_str())))
}

/// `what.name` of an object: `undefined` when it is not there, refused when reading it throws
/// (never taken as absent: a throwing `applyAfter` would send the write at once, a throwing
/// `where` would answer every row).
pub fn property(object: &JsValue, name: &str, what: &dyn Display) -> Result<JsValue, JsValue> {
    property_at(object, &name.into(), name, what)
}

/// `property`, with the name already a JS string (`key`).
fn property_at(object: &JsValue, key: &JsValue, name: &str, what: &dyn Display) -> Result<JsValue, JsValue> {
    Reflect::get(object, key).map_err(|e| unreadable(&Field { parent: what, name }, &e))
}

/// Property names read from many objects of one shape, each made a JS string once.
pub struct PropertyNames<const N: usize> {
    names: [(&'static str, JsValue); N],
}

impl<const N: usize> PropertyNames<N> {
    pub fn new(names: [&'static str; N]) -> Self {
        PropertyNames { names: names.map(|name| (name, JsValue::from_str(name))) }
    }

    /// `property` of `name`, which is one of them or else is made a JS string as `property` does.
    pub fn read(&self, object: &JsValue, name: &str, what: &dyn Display) -> Result<JsValue, JsValue> {
        match self.names.iter().find(|(n, _)| *n == name) {
            Some((_, key)) => property_at(object, key, name, what),
            None => property(object, name, what),
        }
    }
}

/// The items of an array, each read as `what[i]`.
pub fn items(array: &JsValue, what: &dyn Display) -> Result<Vec<JsValue>, JsValue> {
    let length = property(array, "length", what)?.as_f64().unwrap_or(0.0) as u32;
    (0..length).map(|i| Reflect::get_u32(array, i).map_err(|e| unreadable(&format_args!("{what}[{i}]"), &e))).collect()
}

/// Why a property could not be read, in the app's words: what its getter (or a `Proxy`) threw.
fn unreadable(what: &dyn Display, thrown: &JsValue) -> JsValue {
    invalid(format!("{what} could not be read: {}", crate::error::describe(thrown)))
}

/// The properties of a plain object, each a JSON value nested `depth` levels down in its column.
/// A property whose getter throws is refused, as `JSON.stringify` throws, never left out.
fn columns(value: &JsValue, what: &dyn Display, depth: usize) -> Result<serde_json::Map<String, Value>, JsValue> {
    let mut map = serde_json::Map::new();
    for key in own_keys(value).map_err(|e| unreadable(what, &e))?.iter() {
        let name = string(&key, &format_args!("a column name in {what}"))?.unwrap_or_default();
        let item = Reflect::get(value, &key).map_err(|e| unreadable(&Field { parent: what, name: &name }, &e))?;
        if !item.is_undefined() {
            let column = json(&item, &Field { parent: what, name: &name }, depth)?;
            map.insert(name, column);
        }
    }
    Ok(map)
}

/// `value` as a JSON value, itself `depth` arrays and objects down in its column.
fn json(value: &JsValue, what: &dyn Display, depth: usize) -> Result<Value, JsValue> {
    // The kinds a row holds most, first: each question is a call into JS.
    if let Some(s) = string(value, what)? {
        return Ok(Value::String(s));
    }
    if let Some(n) = value.as_f64() {
        return number(n).ok_or_else(|| invalid(format!("{what} is {}, which JSON cannot hold", js_number(n))));
    }
    if let Some(b) = value.as_bool() {
        return Ok(Value::Bool(b));
    }
    if value.is_null() {
        return Ok(Value::Null);
    }
    if value.has_type::<js_sys::Date>() {
        let time = date_time(value).map_err(|e| unreadable(what, &e))?;
        if !time.is_finite() {
            return Err(invalid(format!("{what} is an invalid Date")));
        }
        return date_iso_text(value).map(Value::String).map_err(|e| unreadable(what, &e));
    }
    if is_array(value).map_err(|e| unreadable(what, &e))? {
        let inside = nested(depth, what)?;
        // Inside an array JSON has no way to leave a slot out: undefined becomes null, as there.
        return items(value, what)?
            .into_iter()
            .enumerate()
            .map(|(i, item)| if item.is_undefined() { Ok(Value::Null) } else { json(&item, &format_args!("{what}[{i}]"), inside) })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    if is_plain_object(value, what)? {
        return columns(value, what, nested(depth, what)?).map(Value::Object);
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

/// The depth inside an array or object found `depth` levels down, or a refusal past
/// `MAX_COLUMN_DEPTH`: the server would refuse the whole push request that carried it (holding back
/// every write behind it until this one became a dead letter), an outbox entry nested past what
/// `read_deep` reads would not decode when the database is next opened, and an object that holds itself
/// would recurse until the stack ran out.
fn nested(depth: usize, what: &dyn Display) -> Result<usize, JsValue> {
    if depth < MAX_COLUMN_DEPTH {
        Ok(depth + 1)
    } else {
        Err(invalid(format!("{what} is nested deeper than {MAX_COLUMN_DEPTH} levels, more than the server takes (or holds itself)")))
    }
}

/// A finite number, as an integer when it is one, so `1` stays `1` on the wire.
pub(crate) fn number(n: f64) -> Option<Value> {
    if !n.is_finite() {
        return None;
    }
    if n.fract() == 0.0 && n.abs() <= 9_007_199_254_740_991.0 {
        return Some(Value::Number((n as i64).into()));
    }
    Number::from_f64(n).map(Value::Number)
}
