//! `orderBy` and `limit` of a query or a live query: the order its rows are handed back in, and
//! how many.
//!
//! Values of the ordered column compare across types as Firestore orders them: a missing column
//! and null first, then booleans (false before true), numbers, strings (by Unicode code point),
//! then arrays and objects (by their JSON text, keys sorted). Rows with equal values keep
//! primary-key order, in either direction, so a `limit` always cuts at the same row.

use std::cmp::Ordering;

use kizuna_protocol::Row;
use serde_json::Value;
use wasm_bindgen::prelude::*;

use crate::api::invalid;
use crate::values;

/// The column a result is ordered by, and the direction.
#[derive(Clone)]
pub struct OrderBy {
    column: String,
    descending: bool,
}

/// A row's value of the ordered column, as it compares: the variants in the order of their types.
#[derive(PartialEq, PartialOrd)]
enum SortValue {
    Null,
    Bool(bool),
    Number(f64),
    Text(String),
    Json(String),
}

impl SortValue {
    fn of_json(value: Option<&Value>) -> SortValue {
        match value {
            None | Some(Value::Null) => SortValue::Null,
            Some(Value::Bool(b)) => SortValue::Bool(*b),
            Some(Value::Number(n)) => SortValue::Number(n.as_f64().unwrap_or(0.0)),
            Some(Value::String(s)) => SortValue::Text(s.clone()),
            Some(other) => SortValue::Json(other.to_string()),
        }
    }

    /// The same for a row as IndexedDB handed it back: scalars read as they are, anything else
    /// through JSON as a watch holds it, so a query and a watch order such values alike.
    fn of_js(value: &JsValue) -> SortValue {
        if value.is_undefined() || value.is_null() {
            SortValue::Null
        } else if let Some(b) = value.as_bool() {
            SortValue::Bool(b)
        } else if let Some(n) = value.as_f64() {
            SortValue::Number(n)
        } else if let Some(s) = value.as_string() {
            SortValue::Text(s)
        } else {
            SortValue::of_json(crate::js::decode::<Value>(value).ok().as_ref())
        }
    }
}

impl OrderBy {
    /// `orderBy`: a column, ascending, or `[column, "asc" | "desc"]`.
    pub fn parse(value: &JsValue) -> Result<OrderBy, JsValue> {
        if value.is_string() {
            return Ok(OrderBy { column: values::text(value, "filter.orderBy")?, descending: false });
        }
        let shape = || invalid("filter.orderBy must be a column name or [column, \"asc\" | \"desc\"]");
        if !js_sys::Array::is_array(value) {
            return Err(shape());
        }
        let pair = values::items(value, &"filter.orderBy")?;
        let [column, direction] = pair.as_slice() else { return Err(shape()) };
        let descending = match direction.as_string().as_deref() {
            Some("asc") => false,
            Some("desc") => true,
            _ => return Err(invalid("filter.orderBy[1] must be \"asc\" or \"desc\"")),
        };
        Ok(OrderBy { column: values::text(column, "filter.orderBy[0]")?, descending })
    }

    fn compare(&self, a: &SortValue, b: &SortValue) -> Ordering {
        let order = a.partial_cmp(b).unwrap_or(Ordering::Equal);
        if self.descending { order.reverse() } else { order }
    }

    /// Sorts rows keyed by their values of the column (stably: equal values keep their order).
    fn sort_keyed<T>(&self, keyed: &mut Vec<(SortValue, T)>) {
        kizuna_engine::order::sort_by(keyed, |a, b| self.compare(&a.0, &b.0));
    }

    /// A collector of the first `limit` JS rows in this order, offered in primary-key order.
    pub fn first_rows(&self, limit: usize) -> FirstRows<'_> {
        FirstRows { order_by: self, column: JsValue::from_str(&self.column), limit, held: Vec::new() }
    }

    /// `rows` (in primary-key order) in this order.
    pub fn sort_rows<'r>(&self, rows: impl Iterator<Item = &'r Row>) -> Vec<&'r Row> {
        let mut keyed: Vec<(SortValue, &Row)> = rows.map(|row| (SortValue::of_json(row.get(&self.column)), row)).collect();
        self.sort_keyed(&mut keyed);
        keyed.into_iter().map(|(_, row)| row).collect()
    }
}

/// The first rows of a query in an order, as IndexedDB hands its rows over: it holds at most twice
/// `limit` of them (each with its value of the column) and drops the rest as it goes, so a query
/// with a limit holds in wasm memory what it returns, not what it reads. Without a limit it holds
/// every row's value until it sorts them.
pub struct FirstRows<'o> {
    order_by: &'o OrderBy,
    column: JsValue,
    limit: usize,
    held: Vec<(SortValue, JsValue)>,
}

impl FirstRows<'_> {
    pub fn offer(&mut self, row: JsValue) {
        let value = SortValue::of_js(&js_sys::Reflect::get(&row, &self.column).unwrap_or(JsValue::UNDEFINED));
        self.held.push((value, row));
        if self.held.len() >= self.limit.saturating_mul(2) {
            self.keep_first();
        }
    }

    /// Sorts what is held (stably: rows came in primary-key order) and keeps the first `limit`.
    fn keep_first(&mut self) {
        self.order_by.sort_keyed(&mut self.held);
        self.held.truncate(self.limit);
    }

    pub fn into_array(mut self) -> js_sys::Array {
        self.keep_first();
        self.held.into_iter().map(|(_, row)| row).collect()
    }
}

/// `limit`: a whole number of rows, at least 1.
pub fn parse_limit(value: &JsValue) -> Result<usize, JsValue> {
    let n = value.as_f64().ok_or_else(|| invalid("filter.limit must be a number"))?;
    let n = values::whole_number(n, "filter.limit")?;
    if n < 1 {
        return Err(invalid(format!("filter.limit must be at least 1, not {n}")));
    }
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}
