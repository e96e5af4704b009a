//! JSON values as the app compares them. A server writes a number in the form its column keeps
//! (`5.00` from a `numeric(10, 2)`, `1.0` from a `jsonb`) and the client reads it in wasm in that
//! form, while the app's own `5` crosses in as an integer: `JSON.parse` makes one double of all
//! three and `===` finds them equal, so the filters and index tokens evaluated in wasm must too.

use serde_json::{Number, Value};

/// Whether the app sees `a` and `b` as one value: numbers by the double they hold, arrays and
/// objects item by item.
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w))),
        _ => a == b,
    }
}

/// `n` in the one form the app's own number of that value crosses in (`values::number`): an
/// integer when the double is a whole one JS holds exactly, else the double.
pub fn as_js_number(n: &Number) -> Value {
    n.as_f64().and_then(crate::values::number).unwrap_or_else(|| Value::Number(n.clone()))
}
